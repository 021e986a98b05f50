"""A drafter retrained from a variant's captured traffic (the body of a retrain job): train a
candidate revision on the corpus + the older traffic, score it and the current drafter on the
most recent traffic (held out), install it only when it beats the current one, and record the
figures and the reason in the drafter's status. Teacher data of the traffic is deleted at the end.
"""

from __future__ import annotations

import logging
import shutil
import time
import traceback
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from specserve.platform.rayserve.job_dirs import drafter_dir, scratch_dir
from specserve.platform.rayserve.progress import RegistryProgress
from specserve.platform.settings import PlatformSettings
from specserve.platform.state.records import DrafterStatus, RetrainRecord, RetrainTrigger
from specserve.platform.state.registry import Registry, UnknownVariant, VersionRecord
from specserve.platform.state.traffic import TrafficLog
from specserve.training.traffic import replacement

log = logging.getLogger(__name__)


class RetrainAsk(BaseModel):
    """What a retrain was asked with: by whom, and how much the candidate must gain."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    trigger: RetrainTrigger = "admin"
    min_gain: float = Field(0.0, ge=0, description="held-out tau the candidate must gain")
    started_at: float = Field(default_factory=time.time)


def retrain_from_traffic(
    version: VersionRecord,
    kind: str,
    budget_minutes: float | None,
    settings: PlatformSettings,
    registry: Registry,
    ask: RetrainAsk,
) -> DrafterStatus:
    """Run one retrain of `version`'s `kind` drafter; the status it leaves (also on failure)."""
    key = version.key
    status = registry.drafter(key, kind) or DrafterStatus(kind=kind, state="running")
    queued = [r for r in status.retrains if r.started_at == ask.started_at]  # the admin's
    revision = queued[0].revision if queued else next_revision(status)
    record = RetrainRecord(
        revision=revision, state="running", trigger=ask.trigger, started_at=ask.started_at
    )
    registry.set_drafter(key, status.with_retrain(record))
    scratch = scratch_dir(settings, str(key))
    try:

        def bar(total, desc):
            def write(progress: float) -> None:
                _write_progress(registry, key, kind, ask.started_at, progress)

            return RegistryProgress(write, total)

        outcome = _train_and_compare(
            version, kind, budget_minutes, settings, registry, ask, record, bar, scratch
        )
    except UnknownVariant:
        raise  # deleted meanwhile: nothing to record
    except Exception as err:  # noqa: BLE001 - any failure is reported to the admin, not lost
        log.error("retrain of %s %s failed: %s", key, kind, traceback.format_exc())
        failed = record.model_copy(
            update={"state": "failed", "reason": f"{type(err).__name__}: {err}"[:500]}
        )
        outcome = (registry.drafter(key, kind) or status), failed
    finally:
        shutil.rmtree(scratch, ignore_errors=True)  # the traffic's teacher data goes with it
    current, done = outcome
    done = done.model_copy(update={"finished_at": time.time(), "progress": 1.0})
    return registry.set_drafter(key, current.with_retrain(done))


def _train_and_compare(
    version, kind, budget_minutes, settings, registry, ask, record, progress_bar, scratch
) -> tuple[DrafterStatus, RetrainRecord]:
    """(the status to keep or install, the finished record)."""
    from specserve.engine.drafters.artifact import load_drafter  # lazy: torch (~5 s)
    from specserve.platform.serving import TargetSettings, load_target  # lazy: torch (~5 s)
    from specserve.training import run  # lazy: torch, transformers (~5 s)
    from specserve.training.heldout import compare_on_traffic  # lazy: torch (~5 s)
    from specserve.training.settings import DrafterTrainSettings  # lazy: torch via corpus (~3.5 s)

    key = version.key
    samples = TrafficLog(registry).samples(key.variant)
    if len(samples) < 2:
        raise ValueError(f"{len(samples)} captured requests within retention (need 2 or more)")
    served = load_target(TargetSettings.for_platform(settings, version.base_model))
    checked = served.adapters.ensure(str(key), version.adapter_path, version.adapter_sha256)
    model, tokenizer, eos = (
        served.loaded.model,
        served.loaded.tokenizer,
        served.loaded.eos_token_ids,
    )
    budget = {"budget_minutes": budget_minutes} if budget_minutes else {}
    train_settings = DrafterTrainSettings(kind=kind, **budget)
    out = drafter_dir(settings, key, kind, record.revision)
    drafters = {
        "candidate": run.train_drafter(
            model, tokenizer, version.base_model, eos, out, train_settings,
            adapter_sha256=checked.sha256, data_dir=served.cache_dir / "teacher",
            progress_bar=progress_bar, adapter=str(key), served=samples, traffic_dir=scratch,
        )
    }  # fmt: skip
    status = registry.drafter(key, kind) or DrafterStatus(kind=kind, state="running")
    if status.state == "succeeded" and status.artifact_dir:
        path = Path(status.artifact_dir)
        drafters["current"] = load_drafter(path, model, version.base_model, checked.sha256)
    _, recent = run.traffic_split(tokenizer, min(eos or {0}), samples, train_settings)
    figures = compare_on_traffic(model, tokenizer, eos, drafters, recent, train_settings, str(key))
    return _verdict(status, record, figures, len(samples), ask.min_gain, out)


def _verdict(
    status: DrafterStatus,
    record: RetrainRecord,
    figures: dict,
    samples: int,
    min_gain: float,
    out: Path,
) -> tuple[DrafterStatus, RetrainRecord]:
    """Install the candidate at `out` when it beats the current drafter by `min_gain` on the
    held-out traffic (`figures`: name -> its figures), else remove it: (status, record)."""
    replace, reason = replacement(figures.get("current"), figures["candidate"], min_gain)
    done = record.model_copy(
        update={
            "state": "replaced" if replace else "kept",
            "reason": reason,
            "samples": samples,
            "heldout": figures["candidate"].prompts,
            "current": figures.get("current"),
            "candidate": figures["candidate"],
        }
    )
    if not replace:
        shutil.rmtree(out, ignore_errors=True)  # a refused candidate is not kept
        return status, done
    installed = status.model_copy(
        update={
            "state": "succeeded",
            "progress": 1.0,
            "artifact_dir": str(out),
            "tau": figures["candidate"].tau,
            "revision": record.revision,
            "error": None,
        }
    )
    return installed, done


def _write_progress(registry: Registry, key, kind: str, started_at: float, progress: float):
    """A retrain's progress into its record; the drafter's serving fields stay as they are (and
    a record replaced by a newer retrain is left alone)."""
    status = registry.drafter(key, kind)
    record = status.retrain if status is not None else None
    if record is None or record.started_at != started_at:
        return
    record = record.model_copy(update={"progress": progress})
    registry.set_drafter(key, status.with_retrain(record))


def next_revision(status: DrafterStatus) -> int:
    """The revision a new candidate gets: above the serving one and every one tried before."""
    tried = [r.revision for r in status.retrains]
    serving = status.revision if status.state == "succeeded" else 0
    return max([serving, *tried]) + 1
