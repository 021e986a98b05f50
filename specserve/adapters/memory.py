"""How many bytes resident adapters may take on a device, and what a typical adapter weighs.

`budget_bytes` is the configured fixed budget, else `resident_memory_fraction` of the memory free
on the model's device now (MemAvailable for the CPU, cudaMemGetInfo for a GPU).
`reference_adapter_bytes` is a rank-8 adapter on the family's default targets (the unit the
multiplexing cache counts in).
"""

from __future__ import annotations

import torch

from specserve.adapters.settings import AdapterLimits
from specserve.adapters.validate import BaseModelSpec
from specserve.engine.families import family_of

REFERENCE_RANK = 8


def free_bytes(device: torch.device) -> int:
    """Memory free on `device` now."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    import psutil  # lazy: not a declared dependency; only a CPU budget reads it

    return psutil.virtual_memory().available


def budget_bytes(limits: AdapterLimits, device: torch.device) -> int:
    """The resident budget. Example: fraction 0.2 with 20 GiB free -> 4 GiB."""
    if limits.max_resident_bytes is not None:
        return limits.max_resident_bytes
    return int(limits.resident_memory_fraction * free_bytes(device))


def reference_adapter_bytes(spec: BaseModelSpec, model, dtype: torch.dtype) -> int:
    """Bytes of a rank-8 adapter on the model family's default LoRA targets, in `dtype`.
    Example: SmolLM2-135M (q, k, v, o of 30 layers) in float32 -> 3,686,400."""
    targets = set(family_of(model.config).lora_targets)
    size = torch.empty((), dtype=dtype).element_size()
    per = [
        REFERENCE_RANK * (out_f + in_f) * size
        for name, (out_f, in_f) in spec.linear_shapes.items()
        if name.rsplit(".", 1)[-1] in targets
    ]
    return max(sum(per), 1)
