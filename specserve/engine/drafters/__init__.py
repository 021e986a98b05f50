"""Trained drafters (Medusa heads, EAGLE draft layer): modules, tree construction, artifacts."""
