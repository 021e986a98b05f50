"""Drafter training jobs for the admin API: one Ray task per variant@version and kind, reporting
its state and progress to the registry (queued -> running -> succeeded | failed | cancelled).

`run_drafter_job` is the task body (also callable in-process; with `retrain`, a retrain from the
variant's traffic: rayserve/retrain.py); `RayJobs` starts and cancels tasks.
"""

from __future__ import annotations

import logging
import threading
import traceback

import ray

from specserve.adapters.variants import VariantKey
from specserve.platform.rayserve.job_dirs import drafter_dir
from specserve.platform.rayserve.progress import RegistryProgress
from specserve.platform.rayserve.retrain import RetrainAsk, retrain_from_traffic
from specserve.platform.rayserve.stores import platform_stores
from specserve.platform.settings import PlatformSettings
from specserve.platform.state.registry import (
    DrafterStatus,
    Registry,
    UnknownVariant,
    VersionRecord,
)

log = logging.getLogger(__name__)


def _job_progress(registry: Registry, key, kind: str, total: int | None) -> RegistryProgress:
    """A training job's bar: its progress into the drafter's status (state "running")."""

    def write(progress: float) -> None:
        registry.set_drafter(key, DrafterStatus(kind=kind, state="running", progress=progress))

    return RegistryProgress(write, total)


def run_drafter_job(
    record: dict, kind: str, budget_minutes: float | None, args: dict, retrain: dict | None = None
) -> dict:
    """Train a `kind` drafter for the variant version `record` (its adapter on its base model,
    loaded as a replica loads it); with `retrain` (a `RetrainAsk`), retrain it from the
    variant's captured traffic."""
    # lazy, both: the gateway (RayJobs) imports this module without torch; the task loads it
    from specserve.platform.serving import TargetSettings, load_target  # lazy: torch (~5 s)
    from specserve.training.run import train_drafter  # lazy: torch (~5 s)
    from specserve.training.settings import DrafterTrainSettings  # lazy: torch via corpus (~3.5 s)

    version = VersionRecord.model_validate(record)
    settings = PlatformSettings.from_args(args)
    registry = Registry(platform_stores(settings)[0])
    key = version.key
    if retrain is not None:
        ask = RetrainAsk.model_validate(retrain)
        try:
            return retrain_from_traffic(
                version, kind, budget_minutes, settings, registry, ask
            ).model_dump()
        except UnknownVariant:
            log.info("retrain of %s %s: the variant was deleted meanwhile", key, kind)
            return {}
    registry.set_drafter(key, DrafterStatus(kind=kind, state="running", progress=0.0))
    try:
        served = load_target(TargetSettings.for_platform(settings, version.base_model))
        checked = served.adapters.ensure(str(key), version.adapter_path, version.adapter_sha256)
        out = drafter_dir(settings, key, kind)
        train_settings = DrafterTrainSettings(
            kind=kind, **({"budget_minutes": budget_minutes} if budget_minutes else {})
        )
        drafter = train_drafter(
            served.loaded.model,
            served.loaded.tokenizer,
            version.base_model,
            served.loaded.eos_token_ids,
            out,
            train_settings,
            adapter_sha256=checked.sha256,
            data_dir=served.cache_dir / "teacher",  # teacher data shared by kinds and retrains
            progress_bar=lambda total, desc: _job_progress(registry, key, kind, total),
            adapter=str(key),
        )
        tau = drafter.manifest.heldout_tau
        status = DrafterStatus(
            kind=kind, state="succeeded", progress=1.0, artifact_dir=str(out), tau=tau
        )
    except Exception as err:  # noqa: BLE001 - any failure is reported to the admin, not lost
        log.error("drafter training for %s failed: %s", key, traceback.format_exc())
        status = DrafterStatus(
            kind=kind, state="failed", error=f"{type(err).__name__}: {err}"[:500]
        )
    current = registry.drafter(key, kind)
    if current is not None and current.state == "cancelled":
        return current.model_dump()
    return registry.set_drafter(key, status).model_dump()


class RayJobs:
    """Starts `run_drafter_job` as Ray tasks (CPU, or one GPU when the cluster has them)."""

    def __init__(self, args: dict, num_cpus: float = 1.0, num_gpus: float = 0.0) -> None:
        self.args, self.num_cpus, self.num_gpus = dict(args), num_cpus, num_gpus
        self._refs: dict[tuple[str, str], object] = {}

    def start(
        self, record: VersionRecord, kind: str, budget_minutes: float | None, retrain=None
    ) -> None:
        """`retrain`: a `RetrainAsk` (retrain from traffic) or None (train)."""
        task = ray.remote(run_drafter_job).options(
            num_cpus=self.num_cpus, num_gpus=self.num_gpus, max_retries=0
        )
        ask = retrain.model_dump() if retrain is not None else None
        self._refs[(str(record.key), kind)] = task.remote(
            record.model_dump(), kind, budget_minutes, self.args, ask
        )

    def cancel(self, key: VariantKey, kind: str) -> None:
        ref = self._refs.pop((str(key), kind), None)
        if ref is not None:
            ray.cancel(ref, force=True)


class ThreadJobs:
    """Runs `run_drafter_job` in a background thread of this process (no Ray: tests, one box).
    Cancellation marks the registry; the thread's result is then dropped."""

    def __init__(self, args: dict) -> None:
        self.args = dict(args)
        self.threads: dict[tuple[str, str], threading.Thread] = {}

    def start(
        self, record: VersionRecord, kind: str, budget_minutes: float | None, retrain=None
    ) -> None:
        """`retrain`: a `RetrainAsk` (retrain from traffic) or None (train)."""
        ask = retrain.model_dump() if retrain is not None else None
        thread = threading.Thread(
            target=run_drafter_job,
            args=(record.model_dump(), kind, budget_minutes, self.args, ask),
            daemon=True,
        )
        self.threads[(str(record.key), kind)] = thread
        thread.start()

    def cancel(self, key: VariantKey, kind: str) -> None:
        self.threads.pop((str(key), kind), None)
