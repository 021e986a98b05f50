"""Drafter training by self-distillation: prompts, target answers and features, trainers."""
