"""Continuous batching: the scheduler over one engine (admission, prefill, the decode step), its
settings, tickets, loop thread, shared prefills and load-aware draft caps."""
