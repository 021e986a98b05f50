"""`ruff check` passes on the code, with the rules of pyproject.toml's [tool.ruff.lint]."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LINTED = ("specserve", "tests", "scripts")


def ruff(*args: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "ruff", "check", "--no-cache", "--output-format", "concise"]
    return subprocess.run(
        [*command, *args], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False
    )


def test_ruff_check_passes():
    result = ruff(*LINTED)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_project_rules_are_the_ones_applied(tmp_path):
    # a relative import and a shadowed builtin: neither is in ruff's defaults, both are selected
    sample = tmp_path / "sample.py"
    sample.write_text("from . import x\n\nlist = [x]\n")
    result = ruff("--config", str(ROOT / "pyproject.toml"), str(sample))
    assert result.returncode == 1
    assert "TID252" in result.stdout and "A001" in result.stdout, result.stdout
