"""The platform's stores on Ray: the settings' Redis for registry and pools, and the drafter job
reaches them without importing the Serve application (no app/jobs import cycle)."""

from __future__ import annotations

import ast
from pathlib import Path

from specserve.platform.rayserve.stores import platform_stores
from specserve.platform.settings import PlatformSettings


def test_the_settings_redis_holds_registry_and_pools(redis_server):
    settings = PlatformSettings.from_args({}, env={"REDIS_URL": redis_server.url})
    registry, pools = platform_stores(settings)
    registry.set("k", "v")
    assert pools.get("k") == "v"  # one Redis for both unless SPECSERVE_POOL_REDIS_URL is set
    registry.close()


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
