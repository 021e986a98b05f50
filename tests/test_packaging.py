"""The wheel is the whole runtime: every subpackage and the packaged configs are in it (a
non-editable install serves from it alone), the `specserve` command is declared, no tests."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ("serve.yaml", "policy.yaml", "models.yaml")


def _subpackages() -> list[str]:
    return sorted(
        str(init.parent.relative_to(ROOT).as_posix())
        for init in ROOT.glob("specserve/**/__init__.py")
    )


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> zipfile.ZipFile:
    """`pip wheel --no-deps` of a copy of the checkout's package files (the checkout stays clean)."""
    src = tmp_path_factory.mktemp("src")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, src / name)
    shutil.copytree(
        ROOT / "specserve", src / "specserve", ignore=shutil.ignore_patterns("__pycache__")
    )
    out = tmp_path_factory.mktemp("wheel")
    cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q"]
    subprocess.run([*cmd, "-w", str(out), str(src)], check=True, timeout=300)
    (built,) = out.glob("specserve-*.whl")
    return zipfile.ZipFile(built)


def test_the_wheel_holds_the_packaged_configs(wheel):
    names = set(wheel.namelist())
    for config in CONFIGS:
        assert f"specserve/configs/{config}" in names
        assert (
            wheel.read(f"specserve/configs/{config}")
            == (ROOT / "specserve/configs" / config).read_bytes()
        )


def test_the_wheel_holds_every_subpackage_and_no_tests(wheel):
    names = set(wheel.namelist())
    packages = _subpackages()
    assert "specserve/platform/state" in packages and "specserve/tools/loadtest" in packages
    missing = [p for p in packages if f"{p}/__init__.py" not in names]
    assert not missing, f"subpackages missing from the wheel: {missing}"
    assert not [n for n in names if n.startswith("tests/") or "__pycache__" in n]


def test_the_wheel_declares_the_specserve_command(wheel):
    (entry_points,) = [n for n in wheel.namelist() if n.endswith(".dist-info/entry_points.txt")]
    assert "specserve = specserve.cli:main" in wheel.read(entry_points).decode()
