"""The gateway's acceptance recorder: figures of one variant@version and strategy add up locally,
one flush writes their sum, and figures the store refused are kept for the next flush."""

from __future__ import annotations

from specserve.adapters.variants import VariantKey
from specserve.platform.api.acceptance import AcceptanceRecorder
from specserve.platform.events import DoneInfo
from specserve.platform.state.memory_store import MemoryStore
from specserve.platform.state.records import Acceptance, VariantSpec
from specserve.platform.state.registry import Registry
from specserve.platform.state.store import StoreUnavailable


def _info(strategy: str, forwards: int) -> DoneInfo:
    return DoneInfo(
        variant="v",
        version=1,
        strategy=strategy,
        reason="",
        tau=1.0,
        load_capped_steps=0,
        forwards=forwards,
        drafted_by_depth=[3, 2],
        accepted_by_depth=[2, 1],
        train_kind=None,
    )


class FailingOnce(Registry):
    """A registry whose first acceptance write fails as an unreachable store would."""

    failed = False

    def record_acceptance(self, key, strategy, **figures):
        if not self.failed:
            self.failed = True
            raise StoreUnavailable("down")
        return super().record_acceptance(key, strategy, **figures)


def _registry(cls=Registry) -> Registry:
    registry = cls(MemoryStore())
    registry.register(
        VariantSpec(name="v", base_model="m", adapter_path="/a", adapter_sha256="ab" * 32)
    )
    return registry


def test_figures_add_up_and_one_flush_writes_them():
    registry = _registry()
    recorder = AcceptanceRecorder(registry)
    recorder.record(_info("lookahead", 4), tokens=8)
    recorder.record(_info("lookahead", 6), tokens=10)
    recorder.record(_info("ar", 5), tokens=5)
    recorder.flush()
    got = registry.acceptance(VariantKey("v", 1))
    assert got["lookahead"] == Acceptance(tokens=18, forwards=10, drafted=10, accepted=6)
    assert got["ar"].tokens == 5
    recorder.flush()  # nothing pending: nothing added twice
    assert registry.acceptance(VariantKey("v", 1))["lookahead"].tokens == 18


def test_figures_the_store_refused_are_kept_for_the_next_flush():
    registry = _registry(FailingOnce)
    recorder = AcceptanceRecorder(registry)
    recorder.record(_info("lookahead", 4), tokens=8)
    recorder.flush()
    assert registry.acceptance(VariantKey("v", 1)) == {}
    recorder.record(_info("lookahead", 1), tokens=2)
    recorder.flush()
    assert registry.acceptance(VariantKey("v", 1))["lookahead"].tokens == 10
