"""Drafter training on a fixed corpus by teacher forcing (prefill only), and LoRA fine-tuning."""
