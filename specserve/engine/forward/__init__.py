"""Target forwards: one request's verify forward (`single`) and a batch's (`batch`), their inputs
and masks, the batch's KV cache, their compiled variants, the float32 head and the invariance probe."""
