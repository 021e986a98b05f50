"""The engine: model loading, draft trees, verification, proposers and the decode loop."""
