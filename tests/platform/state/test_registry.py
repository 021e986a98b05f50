"""Registry on every Store: versions (atomic, consecutive, continuing after delete), drafters,
acceptance, policy; concurrency from threads and from separate processes (Redis)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from pydantic import ValidationError

from specserve.adapters.variants import VariantKey
from specserve.platform.state.redis_store import RedisStore
from specserve.platform.state.registry import (
    Acceptance,
    DrafterStatus,
    Registry,
    UnknownVariant,
    VariantSpec,
)
from specserve.platform.state.store import StoreUnavailable
from specserve.policies.settings import PolicySettings

ROOT = Path(__file__).resolve().parents[2]
SHA = "ab" * 32


def spec(name="support-bot", base="smollm2-135m", **kw) -> VariantSpec:
    return VariantSpec(
        name=name, base_model=base, adapter_path=f"/adapters/{name}", adapter_sha256=SHA, **kw
    )


@pytest.fixture
def registry(store):
    clock = iter(range(1000, 100000))
    return Registry(store, clock=lambda: float(next(clock)))


def test_register_bumps_versions_and_reads_back(registry):
    r1 = registry.register(spec(hints={"traffic": "high"}))
    r2 = registry.register(spec())
    assert (r1.version, r2.version) == (1, 2) and r1.key == VariantKey("support-bot", 1)
    assert r2.created_at > r1.created_at
    assert registry.get("support-bot") == r2 and registry.get("support-bot", 1) == r1
    assert registry.get("support-bot", 1).hints == {"traffic": "high"}
    info = registry.variant("support-bot")
    assert [v.version for v in info.versions] == [1, 2] and info.current == r2
    assert info.record == r2 and registry.variant("support-bot@1").record == r1
    registry.register(spec("other"))
    assert registry.names() == ["other", "support-bot"]
    assert [i.name for i in registry.list()] == ["other", "support-bot"]


def test_unknown_variants(registry):
    with pytest.raises(UnknownVariant):
        registry.get("nope")
    registry.register(spec())
    with pytest.raises(UnknownVariant):
        registry.get("support-bot", 2)
    with pytest.raises(UnknownVariant, match="support-bot@9"):
        registry.variant("support-bot@9")
    with pytest.raises(UnknownVariant, match="'nope'"):
        registry.variant("nope")
    with pytest.raises(ValueError):
        registry.variant("bad name")
    with pytest.raises(ValueError):
        registry.get("bad name")


@pytest.mark.parametrize(
    "kw",
    [
        {"name": "bad name"},
        {"name": "a:b"},
        {"name": ""},
        {"base": "x/y"},
        {"adapter_sha256": "abc"},
        {"adapter_path": ""},
        {"hints": {"k" * 65: 1}},
        {"extra": 1},
    ],
)
def test_specs_are_validated(kw):
    fields = {
        "name": "ok",
        "base_model": kw.pop("base", "smollm2-135m"),
        "adapter_path": "/a",
        "adapter_sha256": SHA,
    }
    with pytest.raises(ValidationError):
        VariantSpec(**(fields | kw))


def test_delete_removes_everything_and_versions_continue(registry):
    registry.register(spec())
    r2 = registry.register(spec())
    registry.set_drafter(r2.key, DrafterStatus(kind="eagle", state="succeeded", tau=3.1))
    registry.record_acceptance(r2.key, "eagle", tokens=10, forwards=4)
    registry.set_override("support-bot", "lookahead")
    assert registry.delete("support-bot") is True
    assert registry.delete("support-bot") is False
    with pytest.raises(UnknownVariant):
        registry.variant("support-bot")
    assert registry.names() == [] and registry.list() == []
    r3 = registry.register(spec())
    assert r3.version == 3  # continues: nothing of versions 1-2 can match the new variant
    assert [v.version for v in registry.versions("support-bot")] == [3]
    assert registry.override("support-bot") is None
    assert registry.drafters(r2.key) == {} and registry.acceptance(r2.key) == {}


def test_drafter_status_per_version_and_kind(registry):
    v1 = registry.register(spec()).key
    v2 = registry.register(spec()).key
    queued = registry.set_drafter(v1, DrafterStatus(kind="medusa", state="queued"))
    assert queued.updated_at > 0
    registry.set_drafter(
        v1,
        DrafterStatus(kind="eagle", state="running", progress=0.5, artifact_dir="/art/x"),
    )
    registry.set_drafter(
        v1, DrafterStatus(kind="medusa", state="failed", error="out of time", progress=0.9)
    )
    assert registry.drafter(v1, "medusa").state == "failed"
    assert registry.drafter(v1, "medusa").error == "out of time"
    assert sorted(registry.drafters(v1)) == ["eagle", "medusa"]
    assert registry.drafter(v2, "eagle") is None and registry.drafters(v2) == {}
    with pytest.raises(UnknownVariant):
        registry.set_drafter(
            VariantKey("support-bot", 7), DrafterStatus(kind="eagle", state="queued")
        )
    with pytest.raises(ValidationError):
        DrafterStatus(kind="eagle", state="done")
    with pytest.raises(ValidationError):
        DrafterStatus(kind="eagle", state="running", progress=1.5)


def test_acceptance_accumulates_per_version_and_strategy(registry):
    v1 = registry.register(spec()).key
    v2 = registry.register(spec()).key
    registry.record_acceptance(v1, "lookahead", tokens=30, forwards=20, drafted=40, accepted=10)
    total = registry.record_acceptance(
        v1, "lookahead", tokens=10, forwards=5, drafted=10, accepted=5
    )
    assert total == Acceptance(tokens=40, forwards=25, drafted=50, accepted=15)
    registry.record_acceptance(v1, "eagle", tokens=9, forwards=3)
    got = registry.acceptance(v1)
    assert got["lookahead"].tau == pytest.approx(1.6)
    assert got["lookahead"].acceptance_rate == pytest.approx(0.3)
    assert got["eagle"].tau == 3.0 and got["eagle"].acceptance_rate is None
    assert registry.acceptance(v2) == {}
    registry.record_acceptance(v1, "eagle", costed_tokens=8, cost_milli=4000)
    registry.record_acceptance(v1, "eagle", costed_tokens=4, cost_milli=2000)
    eagle = registry.acceptance(v1)["eagle"]
    assert eagle.speedup == pytest.approx(2.0)
    assert registry.variant(str(v1)).policy_view().measured_speed["eagle"] == (2.0, 12)
    with pytest.raises(ValueError):
        registry.record_acceptance(v1, "eagle", tokens=-1)
    with pytest.raises(ValueError):
        registry.record_acceptance(v1, "Bad:Strategy", tokens=1)


def test_policy_override_settings_and_generation(registry):
    g0 = registry.generation()
    registry.register(spec())
    assert registry.generation() > g0
    assert registry.override("support-bot") is None and registry.policy_settings() is None
    g1 = registry.generation()
    registry.set_override("support-bot", "eagle")
    assert registry.override("support-bot") == "eagle" and registry.generation() > g1
    assert registry.variant("support-bot").override == "eagle"
    assert registry.overrides() == {"support-bot": "eagle"}
    registry.set_override("support-bot", None)
    assert registry.override("support-bot") is None
    with pytest.raises(UnknownVariant):
        registry.set_override("nope", "ar")
    with pytest.raises(ValueError):
        registry.set_override("support-bot", "EAGLE!")
    g2 = registry.generation()
    registry.set_policy_settings(PolicySettings(stability_window_s=60, auto_train=False))
    assert registry.policy_settings() == PolicySettings(stability_window_s=60, auto_train=False)
    assert registry.generation() > g2


def test_variant_reads_one_version_with_its_drafters_and_acceptance(registry):
    v1 = registry.register(spec()).key
    v2 = registry.register(spec()).key
    registry.set_drafter(
        v1, DrafterStatus(kind="eagle", state="succeeded", tau=3.0, artifact_dir="/e")
    )
    registry.set_drafter(v2, DrafterStatus(kind="medusa", state="running", progress=0.4))
    registry.record_acceptance(v1, "eagle", tokens=30, forwards=10)
    registry.set_override("support-bot", "ar")
    current, older = registry.variant("support-bot"), registry.variant("support-bot@1")
    assert (current.version, older.version) == (2, 1) and current.versions == older.versions
    assert list(current.drafters) == ["medusa"] and current.acceptance == {}
    assert older.drafters["eagle"].artifact_dir == "/e" and older.acceptance["eagle"].tau == 3.0
    view = older.policy_view()  # what the strategy policy reads: same names, no dicts
    assert (view.name, view.version, view.forced_strategy) == ("support-bot", 1, "ar")
    assert view.version_times == [r.created_at for r in current.versions]
    assert [(d.kind, d.state, d.tau, d.artifact_dir) for d in view.drafters] == [
        ("eagle", "succeeded", 3.0, "/e")
    ]
    assert view.measured_tau == {"eagle": (3.0, 30)}
    page = registry.page(10)
    assert page.variants == [current]


def test_keys_are_namespaced(registry, store):
    registry.register(spec())
    assert store.hgetall("specserve:variants").keys() == {"support-bot"}
    assert store.get("specserve:variant:support-bot:seq") == "1"
    assert list(store.hgetall("specserve:variant:support-bot:versions")) == ["1"]
    other = Registry(store, namespace="staging")
    assert other.names() == []


def test_fifty_concurrent_registrations_from_threads(registry):
    barrier, errors = threading.Barrier(50), []

    def work():
        try:
            barrier.wait(10)
            registry.register(spec())
        except Exception as err:  # noqa: BLE001 - collected and asserted below
            errors.append(err)

    threads = [threading.Thread(target=work) for _ in range(50)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert errors == []
    assert [v.version for v in registry.versions("support-bot")] == list(range(1, 51))


_WORKER = """
import os, sys, threading
from specserve.platform.state.registry import Registry, VariantSpec
from specserve.platform.state.redis_store import RedisStore
from specserve.platform.state.store import StoreUnavailable
from specserve.policies.settings import PolicySettings
store = RedisStore(os.environ["TEST_REDIS_URL"], socket_timeout_s=5)
reg = Registry(store)
spec = VariantSpec(name="shared", base_model="m", adapter_path="/a", adapter_sha256="cd" * 32)
sys.stdout.write("ready\\n"); sys.stdout.flush()
sys.stdin.readline()  # start together
got = []
ts = [threading.Thread(target=lambda: got.append(reg.register(spec).version)) for _ in range(10)]
[t.start() for t in ts]; [t.join() for t in ts]
print(" ".join(map(str, got)))
"""


def test_fifty_concurrent_registrations_from_five_processes(redis_server):
    env = os.environ | {"TEST_REDIS_URL": redis_server.url, "PYTHONPATH": str(ROOT)}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _WORKER],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(5)
    ]
    try:
        for p in procs:
            assert p.stdout.readline().strip() == "ready"
        for p in procs:
            p.stdin.write("go\n")
            p.stdin.flush()
        outputs = [p.communicate(timeout=60)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert all(p.returncode == 0 for p in procs)
    versions = sorted(int(v) for out in outputs for v in out.split())
    assert versions == list(range(1, 51))
    store = RedisStore(redis_server.url)
    assert [v.version for v in Registry(store).versions("shared")] == list(range(1, 51))
    store.close()


def test_a_second_replica_sees_changes_without_restart(redis_server):
    a, b = RedisStore(redis_server.url), RedisStore(redis_server.url)
    ra, rb = Registry(a), Registry(b)
    ra.register(spec())
    assert rb.get("support-bot").version == 1
    ra.register(spec())
    assert rb.get("support-bot").version == 2 and rb.generation() == ra.generation()
    a.close()
    b.close()


def test_health_reports_an_unreachable_store(redis_server):
    store = RedisStore(redis_server.url, socket_timeout_s=0.3, connect_timeout_s=0.3)
    registry = Registry(store)
    assert registry.health()["status"] == "ok"
    redis_server.stop()
    health = registry.health()
    assert health["status"] == "unavailable" and health["error"]
    assert redis_server.password not in str(health)
    with pytest.raises(StoreUnavailable):
        registry.get("support-bot")
    redis_server.start()  # same address: the same objects work again
    assert registry.health()["status"] == "ok" and registry.names() == []
    store.close()


def test_records_written_by_newer_code_stay_readable(registry, store):
    key = registry.register(spec()).key
    versions = "specserve:variant:support-bot:versions"
    body = json.loads(store.hget(versions, "1")) | {"added_later": 1}
    store.hset(versions, {"1": json.dumps(body)})
    drafters = "specserve:variant:support-bot:drafters"
    store.hset(drafters, {"1:eagle": json.dumps({"kind": "eagle", "state": "queued", "new": 2})})
    assert registry.get("support-bot", 1).adapter_sha256 == SHA
    assert registry.drafter(key, "eagle").state == "queued"


def test_capture_is_off_until_set_and_goes_with_the_variant(registry):
    from specserve.platform.state.records import CaptureSettings
    from specserve.platform.state.traffic import TrafficLog, TrafficSample

    registry.register(spec("cap"))
    assert (
        registry.capture("cap") == CaptureSettings() and not registry.variant("cap").capture.enabled
    )
    on = CaptureSettings(enabled=True, max_samples=2, retention_s=60, max_chars=5)
    registry.set_capture("cap", on)
    assert registry.variant("cap").capture == on
    log = TrafficLog(registry)
    for text in ("first answer", "second", "third"):
        sample = TrafficSample(prompt="a long prompt", output=text, version=1, strategy="ar", at=0)
        assert log.add("cap", sample, on)
    assert [(s.prompt, s.output) for s in log.samples("cap")] == [
        ("a lon", "secon"),
        ("a lon", "third"),
    ]
    late = TrafficSample(prompt="p", output="o", version=9, strategy="ar", at=0)
    assert not log.add("cap", late, on)  # not a version of the variant
    registry.set_capture("cap", on.model_copy(update={"enabled": False}))
    assert not log.add("cap", late.model_copy(update={"version": 1}), on)  # capture off
    registry.set_capture("cap", on)
    assert registry.delete("cap")
    assert not log.add("cap", late.model_copy(update={"version": 1}), on)  # deleted
    registry.register(spec("cap"))  # version 2, a new variant: capture off, no samples
    assert not registry.capture("cap").enabled and log.samples("cap", on) == []
