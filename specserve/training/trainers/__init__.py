"""The drafter trainers: one module per drafter kind (`medusa`, `eagle`) over the shared
time-budgeted loop (`loop`)."""
