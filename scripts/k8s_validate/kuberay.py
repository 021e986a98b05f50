"""What the KubeRay operator rejects although its CRD schema accepts it, and the worker pods' drain
(preStop and grace period against the application's shutdown timeout)."""

from __future__ import annotations

import re

import yaml

from scripts.k8s_validate.render import ray_containers, rayservices

_DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
MAX_RAYSERVICE_NAME = 47  # KubeRay: RayCluster names <= 53, and it appends 6 characters
UPGRADE_TYPES = ("NewCluster", "None", "NewClusterWithIncrementalUpgrade")


def kuberay_problems(objs: list[dict]) -> list[str]:
    """What the KubeRay operator rejects although the CRD schema accepts it (its ValidateRayService*).

    Name a DNS-1035 label of at most 47 characters; with gcsFaultToleranceOptions, no
    REDIS_PASSWORD / RAY_REDIS_ADDRESS / REDIS_USERNAME env in the head container and no
    redis-password / redis-username rayStartParams (KubeRay sets them itself); no headService name;
    a known upgrade type; minReplicas <= replicas <= maxReplicas in each worker group; a head port
    named "serve" or a serveService, or KubeRay makes no gateway Service.
    """
    problems = []
    for rs in rayservices(objs):
        name, spec = rs["metadata"]["name"], rs["spec"]
        where = f"RayService/{name}"
        if len(name) > MAX_RAYSERVICE_NAME or not _DNS1035.match(name):
            problems.append(f"{where}: name must be a DNS-1035 label of <= {MAX_RAYSERVICE_NAME}")
        cluster = spec.get("rayClusterConfig", {})
        head = cluster.get("headGroupSpec", {})
        params = head.get("rayStartParams", {})
        head_env = {e.get("name") for e in ray_containers(rs)["head"].get("env", [])}
        if cluster.get("gcsFaultToleranceOptions") is not None:
            for var in sorted(head_env & {"REDIS_PASSWORD", "RAY_REDIS_ADDRESS"}):
                problems.append(f"{where}: head env {var} conflicts with gcsFaultToleranceOptions")
            if "redis-password" in params:
                problems.append(f"{where}: rayStartParams redis-password with GCS fault tolerance")
            if "ray.io/ft-enabled" in rs["metadata"].get("annotations", {}):
                problems.append(
                    f"{where}: ray.io/ft-enabled annotation with gcsFaultToleranceOptions"
                )
        if "redis-username" in params or "REDIS_USERNAME" in head_env:
            problems.append(f"{where}: redis username outside gcsFaultToleranceOptions")
        if head.get("headService", {}).get("metadata", {}).get("name"):
            problems.append(f"{where}: headService.metadata.name must not be set")
        upgrade = spec.get("upgradeStrategy", {}).get("type")
        if upgrade is not None and upgrade not in UPGRADE_TYPES:
            problems.append(
                f"{where}: upgradeStrategy.type {upgrade!r} is not one of {UPGRADE_TYPES}"
            )
        for group in cluster.get("workerGroupSpecs", []):
            low, high = group.get("minReplicas", 0), group.get("maxReplicas", 2**31 - 1)
            if not low <= group.get("replicas", low) <= high:
                problems.append(f"{where}[{group.get('groupName')}]: replicas outside min..max")
        head_ports = {p.get("name") for p in ray_containers(rs)["head"].get("ports", [])}
        if "serve" not in head_ports and not spec.get("serveService"):
            problems.append(f"{where}: no head port named 'serve' and no serveService")
    return problems


_DRAIN = re.compile(r"specserve drain --this-node --timeout (\d+(?:\.\d+)?)\b")
RAY_STOP_S = 15  # `ray stop` after the drain: its own SIGTERM-then-kill wait, with margin
DRAIN_GRACE_S = 2  # rayserve/drain.py CUT_GRACE_S: the cut streams' error events go out


def drain_problems(objs: list[dict]) -> list[str]:
    """A worker pod stopped without draining, or killed before its drain can end.

    Each worker group's preStop runs `specserve drain --this-node --timeout T` then `ray stop`;
    T is at least the application's shutdown_timeout_s, and the pod's
    terminationGracePeriodSeconds is at least T + DRAIN_GRACE_S + RAY_STOP_S.
    """
    problems = []
    for rs in rayservices(objs):
        serve = yaml.safe_load(rs["spec"].get("serveConfigV2") or "{}") or {}
        args = [app.get("args") or {} for app in serve.get("applications", [])]
        wanted = max([float(a.get("shutdown_timeout_s", 30.0)) for a in args] or [30.0])
        for group in rs["spec"]["rayClusterConfig"].get("workerGroupSpecs", []):
            where = f"RayService/{rs['metadata']['name']}[{group.get('groupName')}]"
            pod = group["template"]["spec"]
            command = " ".join(
                pod["containers"][0]
                .get("lifecycle", {})
                .get("preStop", {})
                .get("exec", {})
                .get("command", [])
            )
            found = _DRAIN.search(command)
            if not found or "ray stop" not in command[found.end() :]:
                problems.append(f"{where}: preStop must drain (specserve drain) then ray stop")
                continue
            timeout = float(found.group(1))
            if timeout < wanted:
                problems.append(
                    f"{where}: drain timeout {timeout:g} < shutdown_timeout_s {wanted:g}"
                )
            grace = pod.get("terminationGracePeriodSeconds", 30)
            if grace < timeout + DRAIN_GRACE_S + RAY_STOP_S:
                problems.append(
                    f"{where}: terminationGracePeriodSeconds {grace} < drain {timeout:g} + "
                    f"{DRAIN_GRACE_S} + ray stop {RAY_STOP_S}"
                )
    return problems
