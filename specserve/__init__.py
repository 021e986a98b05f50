"""specserve: multi-tenant LLM serving with lossless speculative decoding per LoRA variant."""

__version__ = "0.1.0"
