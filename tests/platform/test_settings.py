from pathlib import Path

import pytest
import yaml

from specserve.platform.settings import PlatformSettings, TenantKeys

REPO = Path(__file__).resolve().parents[2]


def test_serve_yaml_args_and_environment():
    args = yaml.safe_load((REPO / "specserve" / "configs" / "serve.yaml").read_text())["applications"][0]["args"]
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
