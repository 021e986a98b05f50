"""The conformance probe: `probe(config)` decides from behaviour whether the engine serves an
architecture, on a tiny random fp32 model of it (`tiny`), by the checks in `checks` and
`batched`, and returns a `ProbeResult` kept per architecture (`store`).
"""

from specserve.engine.probe.result import PROBE_VERSION, CheckFailure, ProbeResult
from specserve.engine.probe.run import architecture_of, lora_targets, probe

__all__ = [
    "PROBE_VERSION",
    "CheckFailure",
    "ProbeResult",
    "architecture_of",
    "lora_targets",
    "probe",
]
