"""rayserve."""
