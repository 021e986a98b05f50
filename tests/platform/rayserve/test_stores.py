"""The platform's stores on Ray: the settings' Redis for registry and pools (none: refused, naming
the remedies, never a silent memory store), and the drafter job reaches them without importing
the Serve application (no app/jobs import cycle)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from specserve.platform.rayserve.stores import platform_stores
from specserve.platform.settings import PlatformSettings
from specserve.platform.state.embedded import NoRedisServer


def test_the_settings_redis_holds_registry_and_pools(redis_server):
    settings = PlatformSettings.from_args({}, env={"REDIS_URL": redis_server.url})
    registry, pools = platform_stores(settings)
    registry.set("k", "v")
    assert pools.get("k") == "v"  # one Redis for both unless SPECSERVE_POOL_REDIS_URL is set
    registry.close()


def test_without_redis_url_a_replica_refuses_rather_than_keep_nothing():
    with pytest.raises(NoRedisServer, match="REDIS_URL is unset") as refused:
        platform_stores(PlatformSettings.from_args({}, env={}))
    assert "--store memory" in str(refused.value) and "scripts/setup.sh" in str(refused.value)


def test_jobs_import_nothing_of_the_serve_application():
    """Not even inside a function: the Serve app imports the jobs, never the other way round."""
    from specserve.platform.rayserve import jobs

    tree = ast.parse(Path(jobs.__file__).read_text())
    imported = {
        node.module if isinstance(node, ast.ImportFrom) else alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.Import | ast.ImportFrom)
        for alias in node.names
    }
    assert "specserve.platform.rayserve.stores" in imported
    assert not {m for m in imported if m and m.endswith("rayserve.deployments")}
