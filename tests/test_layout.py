"""The package layout must not shadow the standard library."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _in_stdlib(path: str) -> bool:
    stdlib = Path(sysconfig.get_paths()["stdlib"]).resolve()
    return stdlib in Path(path).resolve().parents


def test_platform_is_stdlib_in_process():
    import platform

    assert _in_stdlib(platform.__file__), platform.__file__
    assert isinstance(platform.system(), str) and platform.system()


def test_platform_is_stdlib_with_repo_root_first_on_path():
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); sys.path.insert(0, '');"
        "import platform; print(platform.__file__); print(platform.system())"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run(
        [sys.executable, "-c", code, str(ROOT)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    file, system = out.stdout.split("\n")[:2]
    assert _in_stdlib(file), file
    assert system


def test_no_top_level_module_named_platform_in_repo_root():
    assert not (ROOT / "platform.py").exists()
    assert not (ROOT / "platform").exists()


def test_specserve_platform_is_a_package():
    spec = importlib.util.find_spec("specserve.platform")
    assert spec is not None
    assert spec.submodule_search_locations is not None  # a package, not a module
    import specserve.platform as sp

    assert Path(sp.__file__).name == "__init__.py"
    assert Path(sp.__file__).resolve().parent == ROOT / "specserve" / "platform"
