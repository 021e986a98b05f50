"""The model commands (generate, tune, bench: what scripts/gpu runs) import without the serving
stack: the GPU check machine has torch, transformers and peft, but no Ray, Redis or FastAPI."""

from __future__ import annotations

import subprocess
import sys

SERVING_STACK = ("ray", "fastapi", "starlette", "uvicorn", "redis", "prometheus_client")
MODULES = ("specserve.cli", "specserve.cli.target", "specserve.cli.generate", "specserve.cli.tune")
_PROBE = """
import importlib, importlib.abc, sys
blocked = set(sys.argv[1].split(","))
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in blocked:
            raise ImportError(f"{name} is not on the GPU check machine")
sys.meta_path.insert(0, Block())
for module in sys.argv[2].split(","):
    importlib.import_module(module)
importlib.import_module("specserve.cli").build_parser()
importlib.import_module("specserve.cli.bench")
"""


def _probe(blocked: tuple[str, ...]) -> subprocess.CompletedProcess:
    args = [sys.executable, "-c", _PROBE, ",".join(blocked), ",".join(MODULES)]
    return subprocess.run(args, check=False, capture_output=True, text=True, timeout=120)


def test_model_commands_import_without_the_serving_stack():
    done = _probe((*SERVING_STACK, "pydantic_settings"))
    assert done.returncode == 0, done.stderr[-2000:]


def test_the_probe_catches_a_serving_import():
    done = _probe(("torch",))  # every model command needs torch: the probe must say so
    assert done.returncode != 0 and "not on the GPU check machine" in done.stderr
