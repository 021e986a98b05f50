"""Per-row LoRA: adapters applied to the rows of one forward (`batch`), the slot buffers of mixed
batches (`slots`) and the store of adapters as plain tensors beside a base model (`store`)."""
