"""LoRA variants: validation, loading, LRU and per-version artifacts; may import engine and peft."""
