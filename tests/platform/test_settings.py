from pathlib import Path

import pytest
import yaml

from specserve.env import DEPLOYMENT_VARIABLES, EnvVar
from specserve.platform.settings import Environment, PlatformSettings, TenantKeys

REPO = Path(__file__).resolve().parents[2]


def test_serve_yaml_args_and_environment():
    args = yaml.safe_load((REPO / "specserve" / "configs" / "serve.yaml").read_text())[
        "applications"
    ][0]["args"]
    env = {
        "REDIS_URL": "redis://:pw@r:6379/1",
        "SPECSERVE_ADMIN_TOKEN": "tok",
        "SPECSERVE_POLICY_FILE": "/etc/p.yaml",
        "SPECSERVE_ADAPTER_ROOT": "/data/adapters",
        "SPECSERVE_CACHE": "/data/cache",
    }
    s = PlatformSettings.from_args(args, env)
    assert s.models == ["smollm2-135m"] and s.admin_token.get_secret_value() == "tok"
    assert (
        s.pool_redis_url == s.redis_url == "redis://:pw@r:6379/1"
    )  # pools default to the registry Redis
    assert s.resolved_policy_file() == Path("/etc/p.yaml") and s.resolved_adapter_root() == Path(
        "/data/adapters"
    )
    assert "pw" not in repr(s.admin_token)


def test_unknown_or_secret_args_are_refused_with_the_valid_names():
    with pytest.raises(ValueError, match="max_body_bytes"):
        PlatformSettings.from_args({"max_body_byte": 5}, {})
    with pytest.raises(ValueError, match="admin_token"):
        PlatformSettings.from_args({"admin_token": "in-the-config"}, {})


def test_tenant_keys_file_of_the_k8s_example(tmp_path):
    keys = TenantKeys.from_file(REPO / "k8s" / "overlays" / "dev" / "tenants.example.yaml")
    assert keys.variants_by_key["dev-only-change-me-acme-key"] == {"support-bot"}
    assert TenantKeys.from_file(tmp_path / "missing.yaml").variants_by_key == {}
    bad = tmp_path / "bad.yaml"
    bad.write_text("tenants: {a: {variants: [x]}}")
    with pytest.raises(ValueError, match="needs keys"):
        TenantKeys.from_file(bad)


def test_an_explicit_environment_is_the_only_one_read(monkeypatch):
    monkeypatch.setenv("REDIS_URL", "redis://process-env:6379/0")
    monkeypatch.setenv("SPECSERVE_POLICY_FILE", "/from/process.yaml")
    none = PlatformSettings.from_args({}, {})
    assert none.redis_url is None and none.policy_file is None
    process = PlatformSettings.from_args({})
    assert process.redis_url == "redis://process-env:6379/0"
    assert process.policy_file == Path("/from/process.yaml")


def test_environment_overrides_paths_and_empty_variables_count_as_unset(tmp_path):
    tenants = tmp_path / "tenants.yaml"
    tenants.write_text("tenants: {a: {keys: [k1], variants: [v]}}")
    env = {
        "REDIS_URL": "redis://r:1/0",
        "SPECSERVE_POOL_REDIS_URL": "redis://pools:2/0",
        "SPECSERVE_ADMIN_TOKEN": "",
        "SPECSERVE_ADAPTER_ROOT": "",
        "SPECSERVE_TENANT_KEYS_FILE": str(tenants),
    }
    s = PlatformSettings.from_args({"adapter_root": "/from/args", "policy_file": "/p.yaml"}, env)
    assert (s.redis_url, s.pool_redis_url) == ("redis://r:1/0", "redis://pools:2/0")
    assert s.admin_token is None and s.adapter_root == Path("/from/args")
    assert s.tenant_keys.variants_by_key == {"k1": {"v"}}
    overridden = PlatformSettings.from_args(
        {"policy_file": "/p.yaml"}, {"SPECSERVE_POLICY_FILE": "/e"}
    )
    assert overridden.policy_file == Path("/e")


def test_every_env_only_field_is_refused_as_an_arg():
    for name in ("tenant_keys", "redis_url", "pool_redis_url", "cache_dir"):
        with pytest.raises(ValueError, match="unknown application args") as ei:
            PlatformSettings.from_args({name: "x"}, {})
        assert name in str(ei.value) and "max_tokens" in str(ei.value)


def test_environment_repr_hides_the_secrets():
    env = Environment.read({"REDIS_URL": "redis://:pw-1@r:1/0", "SPECSERVE_ADMIN_TOKEN": "tok-2"})
    assert "pw-1" not in repr(env) and "tok-2" not in repr(env)


def test_the_store_is_redis_unless_the_memory_store_is_chosen():
    assert PlatformSettings.from_args({}, {}).store == "redis"
    chosen = PlatformSettings.from_args({"store": "memory"}, {})
    assert chosen.store == "memory" and not chosen.redis_embedded
    with pytest.raises(ValueError, match="store"):
        PlatformSettings.from_args({"store": "sqlite"}, {})
    with pytest.raises(ValueError, match="unset one"):
        PlatformSettings.from_args({"store": "memory"}, {"REDIS_URL": "redis://r:6379/0"})
    with pytest.raises(ValueError, match="redis_embedded"):  # set by `specserve up` only
        PlatformSettings.from_args({"redis_embedded": True}, {})
    env = {"REDIS_URL": "redis://r:6379/0", "SPECSERVE_REDIS_EMBEDDED": "1"}
    assert PlatformSettings.from_args({}, env).redis_embedded


def test_each_variable_is_spelled_once_as_an_environment_field():
    aliases = [field.alias for field in Environment.model_fields.values()]
    assert sorted(aliases) == sorted(EnvVar) and len(set(aliases)) == len(aliases)
    assert set(DEPLOYMENT_VARIABLES) <= set(EnvVar)
    env = Environment.read({EnvVar.CACHE: "/c", "SPECSERVE_cache": "/other", "cache_dir": "/x"})
    assert env.cache_dir == Path("/c")  # by the exact name only
