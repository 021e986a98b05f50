"""Developer tools around specserve: `loadtest` (load scenarios against a running server) and
`bench` (decoding strategies against transformers `generate()`, offline)."""
