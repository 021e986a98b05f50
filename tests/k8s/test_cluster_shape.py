"""The cluster the demo runs (tools/cluster/shape.py, read from k8s/base/rayservice.yaml) is the one
KubeRay runs: the dev overlay's rendered RayService gives the same shape, and Ray's own KubeRay
translator (RayCluster spec -> autoscaler config) agrees on node resources, bounds and options."""

from __future__ import annotations

import copy

import pytest
from ray.autoscaler._private.kuberay.autoscaling_config import (
    _derive_autoscaling_config_from_ray_cr,
)

from scripts.k8s_validate.render import the
from specserve.tools.cluster.shape import HEAD_TYPE, ClusterShape, quantity


def _rayservice(rendered, overlay="dev") -> dict:
    return the(rendered[overlay], "RayService", "specserve")


def _kuberay_view(rayservice: dict) -> dict:
    """What the in-tree autoscaler of a KubeRay cluster is configured with."""
    cr = {
        "metadata": {"name": "specserve", "namespace": "specserve"},
        "spec": rayservice["spec"]["rayClusterConfig"],
    }
    return _derive_autoscaling_config_from_ray_cr(cr)


def test_the_demo_runs_the_dev_overlays_cluster(rendered):
    assert ClusterShape.from_manifest() == ClusterShape.from_rayservice(_rayservice(rendered))


def test_kuberay_sees_the_same_node_types_and_options(rendered):
    rayservice = _rayservice(rendered)
    shape, kuberay = ClusterShape.from_rayservice(rayservice), _kuberay_view(rayservice)
    assert kuberay["idle_timeout_minutes"] * 60 == shape.idle_timeout_s
    assert kuberay["upscaling_speed"] == shape.upscaling_speed
    assert kuberay["available_node_types"]["headgroup"]["resources"]["CPU"] == shape.head_cpus
    for name, node in shape.workers.items():
        theirs = kuberay["available_node_types"][name]
        assert theirs["resources"]["CPU"] == node.cpus
        assert theirs["resources"]["memory"] == node.memory_bytes
        assert (theirs["min_workers"], theirs["max_workers"]) == (
            node.min_workers,
            node.max_workers,
        )


def test_the_fake_provider_gets_the_shapes_node_types(rendered):
    shape = ClusterShape.from_rayservice(_rayservice(rendered))
    config = shape.autoscaling_config("127.0.0.1:1", object_store_bytes=2**28)
    types = config["available_node_types"]
    assert types[HEAD_TYPE]["resources"]["CPU"] == 0  # the head schedules no replicas
    assert types["cpu"]["resources"]["CPU"] == 2
    assert (types["cpu"]["min_workers"], types["cpu"]["max_workers"]) == (1, 2)
    assert config["idle_timeout_minutes"] == shape.idle_timeout_s / 60
    assert config["provider"]["type"] == "fake_multinode"


@pytest.mark.parametrize(
    "path, value",
    [
        (("autoscalerOptions", "idleTimeoutSeconds"), 60),
        (("workerGroupSpecs", 0, "maxReplicas"), 5),
        (
            (
                "workerGroupSpecs",
                0,
                "template",
                "spec",
                "containers",
                0,
                "resources",
                "limits",
                "cpu",
            ),
            "4",
        ),
    ],
)
def test_a_changed_rayservice_no_longer_agrees(rendered, path, value):
    changed = copy.deepcopy(_rayservice(rendered))
    node = changed["spec"]["rayClusterConfig"]
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    assert ClusterShape.from_rayservice(changed) != ClusterShape.from_manifest()


def test_prod_runs_gpu_groups_the_demo_leaves_out(rendered):
    shape = ClusterShape.from_rayservice(_rayservice(rendered, "prod"), cpu_only=False)
    assert "gpu" in shape.workers and "gpu" not in ClusterShape.from_manifest().workers


def test_quantities():
    assert quantity("500m") == 0.5 and quantity("4Gi") == 4 * 2**30 and quantity(2) == 2
    with pytest.raises(ValueError, match="quantity"):
        quantity("2 cores")
