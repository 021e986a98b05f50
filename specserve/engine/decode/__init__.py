"""Decoding one request: per-request state (`state`), the propose -> verify -> commit loop
(`core.Decoder`) and `engine.Engine`, the decoder that admits its model's family first."""
