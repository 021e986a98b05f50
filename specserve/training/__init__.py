"""Drafter training (Medusa, EAGLE) by self-distillation; may import the engine only."""
