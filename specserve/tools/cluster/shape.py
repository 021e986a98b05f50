"""The Ray cluster KubeRay runs, read from the RayService manifest (`ClusterShape.from_rayservice`):
head resources, CPU worker groups (resources from container limits, min/max replicas) and the
autoscaler's options; `autoscaling_config` turns it into a fake-provider config for one machine."""

from __future__ import annotations

import math
import re
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field

from specserve.paths import repo_root

RAYSERVICE = Path("k8s/base/rayservice.yaml")
HEAD_TYPE = "ray.head.default"  # the name Ray's fake provider gives the head's node type
_SUFFIXES = {"m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}
_SUFFIXES |= {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}
_QUANTITY = re.compile(r"^([0-9.]+)([a-zA-Z]*)$")
# KubeRay's autoscaler maps upscalingMode to an upscaling speed (Default and Aggressive: no limit)
UPSCALING_SPEED = {"Conservative": 1.0, "Default": 1000.0, "Aggressive": 1000.0}


def quantity(value: str | float) -> float:
    """A Kubernetes quantity as a number: "500m" -> 0.5, "4Gi" -> 4294967296."""
    match = _QUANTITY.match(str(value))
    if match is None or match.group(2) not in {"", *_SUFFIXES}:
        raise ValueError(f"not a Kubernetes quantity: {value!r}")
    return float(match.group(1)) * _SUFFIXES.get(match.group(2), 1.0)


class NodeType(BaseModel):
    """One worker group as the autoscaler sees it: logical CPUs and memory bytes per node."""

    model_config = ConfigDict(frozen=True)

    cpus: float = Field(ge=0)
    memory_bytes: int = Field(ge=0)
    min_workers: int = Field(ge=0)
    max_workers: int = Field(ge=1)


class ClusterShape(BaseModel):
    """Head CPUs (the head schedules no replicas: 0), worker groups by name, the autoscaler's idle
    timeout and upscaling speed."""

    model_config = ConfigDict(frozen=True)

    head_cpus: float = Field(ge=0)
    workers: dict[str, NodeType] = Field(min_length=1)
    idle_timeout_s: float = Field(gt=0)
    upscaling_speed: float = Field(gt=0)

    @classmethod
    def from_rayservice(cls, rayservice: dict, cpu_only: bool = True) -> ClusterShape:
        """The shape of a RayService (a parsed manifest); `cpu_only` leaves out groups whose
        containers ask for GPUs (the dev overlay drops them; this machine has none)."""
        spec = rayservice["spec"]["rayClusterConfig"]
        options = spec.get("autoscalerOptions") or {}
        head = spec["headGroupSpec"]
        workers = {
            group["groupName"]: _node_type(group)
            for group in spec["workerGroupSpecs"]
            if not (cpu_only and _gpus(group))
        }
        return cls(
            head_cpus=float(head.get("rayStartParams", {}).get("num-cpus", 0)),
            workers=workers,
            idle_timeout_s=float(options.get("idleTimeoutSeconds", 60)),
            upscaling_speed=UPSCALING_SPEED[options.get("upscalingMode", "Default")],
        )

    @classmethod
    def from_manifest(cls, path: Path | None = None) -> ClusterShape:
        """The shape of k8s/base/rayservice.yaml (its CPU groups: what the dev overlay runs)."""
        path = path or repo_root() / RAYSERVICE
        return cls.from_rayservice(yaml.safe_load(Path(path).read_text()))

    def autoscaling_config(self, gcs_address: str, object_store_bytes: int) -> dict:
        """Ray's cluster config for its fake multi-node provider (the one Ray's autoscaler tests
        use): this shape's node types, one machine, nodes joining `gcs_address`. The provider
        takes CPUs (and GPUs) only, not memory: replicas here ask for CPUs alone; each node's
        object store is `object_store_bytes` (all nodes share this machine's /dev/shm)."""
        types = {
            name: {
                "resources": {"CPU": t.cpus, "object_store_memory": object_store_bytes},
                "node_config": {},
                "min_workers": t.min_workers,
                "max_workers": t.max_workers,
            }
            for name, t in self.workers.items()
        }
        types[HEAD_TYPE] = {"resources": {"CPU": self.head_cpus}, "node_config": {}}
        types[HEAD_TYPE]["max_workers"] = 0
        provider = {"type": "fake_multinode", "gcs_address": gcs_address}
        provider |= {"use_node_id_as_ip": True, "disable_node_updaters": True}
        provider["disable_launch_config_check"] = True
        empty = ("initialization_commands", "setup_commands", "head_setup_commands")
        empty += ("worker_setup_commands", "head_start_ray_commands", "worker_start_ray_commands")
        empty += ("cluster_synced_files", "rsync_exclude", "rsync_filter")
        return {
            "cluster_name": "specserve-demo",
            "max_workers": sum(t.max_workers for t in self.workers.values()),
            "provider": provider,
            "available_node_types": types,
            "head_node_type": HEAD_TYPE,
            "upscaling_speed": self.upscaling_speed,
            "idle_timeout_minutes": self.idle_timeout_s / 60.0,
            "auth": {},
            "docker": {},
            "file_mounts": {},
            "file_mounts_sync_continuously": False,
            **{key: [] for key in empty},
        }


def _gpus(group: dict) -> bool:
    return any(
        "nvidia.com/gpu" in (c.get("resources", {}).get("limits") or {})
        for c in group["template"]["spec"]["containers"]
    )


def _node_type(group: dict) -> NodeType:
    """A worker group's node type: CPUs and memory from its Ray container's limits (KubeRay's
    autoscaler reads them there when rayStartParams does not set them)."""
    container = group["template"]["spec"]["containers"][0]
    limits = container["resources"]["limits"]
    params = group.get("rayStartParams") or {}
    cpus = quantity(params.get("num-cpus", limits["cpu"]))
    memory = math.ceil(quantity(params.get("memory", limits["memory"])))
    return NodeType(
        cpus=math.ceil(cpus),  # Ray rounds a fractional CPU limit up
        memory_bytes=memory,
        min_workers=int(group["minReplicas"]),
        max_workers=int(group["maxReplicas"]),
    )
