"""Choices measured once per model and device and cached: the cost curve (`cost`), draft sizes
(`drafts`), whether to compile (`compile_choice`) and which dtype serves fastest (`dtype_choice`)."""
