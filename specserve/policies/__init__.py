"""Strategy policy, load gating and routing helpers; no heavy imports."""
