"""`probe(config)`: the checks in order on the config's tiny model, stopping at the first that
fails; the result is kept per architecture (store.py) so a second call costs a file read.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import torch
import transformers

from specserve.engine.probe import batched, checks, store, tiny
from specserve.engine.probe.projections import find_projections
from specserve.engine.probe.result import CheckFailure, ProbeResult

log = logging.getLogger(__name__)

CHECKS = (  # (name, check): the cheap and structural ones first
    ("layer kinds", checks.layer_kinds),
    ("projections", checks.projections),
    ("drafters", checks.drafters),
    ("ar = generate()", checks.ar_equals_generate),
    ("tree verify = sequential", checks.tree_verify),
    ("every strategy = ar", checks.strategies_equal_ar),
    ("LoRA = merged weights", checks.lora_equals_merged),
    ("batched = alone", batched.batched_equal_alone),
)


def architecture_of(config) -> str:
    """The class transformers' AutoModelForCausalLM builds for `config`, else what the config's
    `architectures` names, else the config class. Example: a Starcoder2Config ->
    "Starcoder2ForCausalLM"."""
    from transformers.models.auto.modeling_auto import (  # lazy: ~0.35 s to import; unlisted models only
        MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
    )

    mapped = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(getattr(config, "model_type", None))
    if mapped:
        return mapped
    named = getattr(config, "architectures", None) or [type(config).__name__]
    return named[0]


def not_decoder_only(config) -> str | None:
    """Why `config` is not a decoder-only causal LM (None: it is)."""
    from transformers.models.auto.modeling_auto import (  # lazy: ~0.35 s to import; unlisted models only
        MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
        MODEL_FOR_MASKED_LM_MAPPING_NAMES,
    )

    model_type = getattr(config, "model_type", None)
    if getattr(config, "is_encoder_decoder", False):
        return "an encoder-decoder architecture (its causal-LM class is the decoder half)"
    if model_type in MODEL_FOR_MASKED_LM_MAPPING_NAMES:
        return "an encoder architecture (masked LM) with a causal-LM head"
    if model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        return f"model type {model_type!r} is not in transformers' AutoModelForCausalLM mapping"
    return None


def probe(config, cache_dir: Path | None = None, refresh: bool = False) -> ProbeResult:
    """Run (or recall) the probe for `config`'s architecture. `cache_dir`: where results are
    kept across processes (None: this process only); `refresh`: run again even if kept.
    Never raises for the architecture's sake: a check that errors is that check failing."""
    base = {
        "architecture": architecture_of(config),
        "model_type": str(getattr(config, "model_type", "")),
        "transformers_version": transformers.__version__,
    }
    why = not_decoder_only(config)
    if why is not None:
        return ProbeResult(
            **base, admitted=False, failure=CheckFailure(check="decoder-only", detail=why)
        )
    start = time.perf_counter()
    try:
        small = tiny.tiny_config(config)
    except Exception as e:  # noqa: BLE001 - the config class refuses the shrunk sizes
        return ProbeResult(**base, admitted=False, failure=_tiny_failure(e))
    name = store.key(base["architecture"], tiny.fingerprint(small), base["transformers_version"])
    kept = None if refresh else store.lookup(name, cache_dir)
    if kept is not None:
        return kept
    result = ProbeResult(**base, fingerprint=tiny.fingerprint(small), admitted=False)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a tiny model's ops are too small to split: 1 thread is ~10x faster
    try:
        model = tiny.build(small)
    except Exception as e:  # noqa: BLE001 - the model class refuses the shrunk sizes
        result.failure = _tiny_failure(e)
    else:
        result = _run(model, result)
    finally:
        torch.set_num_threads(threads)
    result.seconds = round(time.perf_counter() - start, 2)
    store.keep(name, result, cache_dir)
    log.info(
        "probe %s (%s): %s in %.1f s", name, base["model_type"], result.reason(), result.seconds
    )
    return result


def lora_targets(config) -> tuple[str, ...]:
    """A finetune's default LoRA targets for `config`'s architecture: the attention
    projections found in its tiny model (all found projections where it has none in an
    attention block), remembered per architecture and features in this process."""
    small = tiny.tiny_config(config)
    name = f"{architecture_of(config)}-{tiny.fingerprint(small)}"
    if name not in _TARGETS:
        found = find_projections(tiny.build(small))
        _TARGETS[name] = found.attention or found.all
    return _TARGETS[name]


_TARGETS: dict[str, tuple[str, ...]] = {}  # a memo, not configuration


def _run(model, result: ProbeResult) -> ProbeResult:
    p = checks.Probe(model=model, prompts=checks.prompts(model.config.get_text_config().vocab_size))
    for name, check in CHECKS:
        try:
            check(p)
        except checks.CheckFailed as e:
            result.failure = e.failure
            break
        except Exception as e:  # noqa: BLE001 - an error of the architecture fails its check
            result.failure = CheckFailure(check=name, detail=_error(e))
            break
        result.passed.append(name)
    result.admitted = result.failure is None
    result.lora_targets = list(p.projections.attention or p.projections.all)
    result.projections = list(p.projections.all)
    result.lora_checked = list(p.lora_checked)
    return result


def _tiny_failure(e: Exception) -> CheckFailure:
    return CheckFailure(check="tiny model", detail=_error(e))


def _error(e: Exception) -> str:
    text = " ".join(f"{type(e).__name__}: {e}".split())
    return text if len(text) <= 300 else text[:297] + "..."
