"""`specserve variants list` pages through the admin API."""

from __future__ import annotations

import json

from specserve.cli import main as cli_main


def test_variants_list_pages_through_the_admin_api(capsys, monkeypatch, tmp_path):
    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    from specserve.adapters.settings import AdapterLimits
    from specserve.platform.api.admin import Admin, admin_router
    from specserve.platform.api.client import AdminClient
    from specserve.platform.state.memory_store import MemoryStore
    from specserve.platform.state.registry import Registry, VariantSpec
    from specserve.policies.settings import PolicySettings

    registry = Registry(MemoryStore())
    names = [f"v{i:03d}" for i in range(230)]
    for name in names:
        registry.register(
            VariantSpec(name=name, base_model="m", adapter_path="/a", adapter_sha256="ab" * 32)
        )
    admin = Admin(registry, "tok", {}, AdapterLimits(root=tmp_path), PolicySettings())
    app = FastAPI()
    app.include_router(admin_router(admin))
    http = TestClient(app)  # AdminClient.call is routed here
    paths = []

    def call(self, method, path, body=None):
        paths.append(path)
        r = http.request(
            method, f"/admin{path}", json=body, headers={"Authorization": "Bearer tok"}
        )
        assert r.status_code == 200, r.text
        return r.json()

    monkeypatch.setattr(AdminClient, "call", call)
    argv = ["variants", "list", "--url", "http://x", "--token", "tok", "--cache-dir", str(tmp_path)]
    assert cli_main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert [v["name"] for v in out["variants"]] == names and out["has_more"] is False
    assert len(paths) == 3  # pages of 100
    assert cli_main([*argv, "--limit", "120", "--after", "v009"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [v["name"] for v in out["variants"]] == names[10:130]
    assert out["has_more"] is True and out["last_id"] == "v129"
    assert cli_main([*argv, "--limit", "0"]) == 2
