"""Exposure (nothing reachable from outside the cluster but the gateway's port) and secrets (Redis
passwords from Secrets, no secret-looking literal in a manifest)."""

from __future__ import annotations

import re

from scripts.k8s_validate.render import ray_containers, rayservices, workload_containers

GATEWAY_PORT = 8000
_SECRET_NAME = re.compile(r"(PASSWORD|TOKEN|SECRET|KEYS?)$")  # env names holding secrets


def _services(objs: list[dict]) -> dict[str, dict]:
    return {o["metadata"]["name"]: o for o in objs if o.get("kind") == "Service"}


def gateway_service_name(objs: list[dict]) -> str | None:
    """Name of the Service KubeRay makes for the Serve proxies (RayService spec.serveService)."""
    for rs in rayservices(objs):
        name = rs["spec"].get("serveService", {}).get("metadata", {}).get("name")
        return name or f"{rs['metadata']['name']}-serve-svc"
    return None


def exposure_problems(objs: list[dict]) -> list[str]:
    """Anything reachable from outside the cluster other than the gateway's port.

    Outside means a Service of type LoadBalancer or NodePort (or with externalIPs), an Ingress,
    a head Service or KubeRay ingress that is not ClusterIP. Only the gateway Service may be
    LoadBalancer, only on port 8000; Ingress backends must be that Service on that port.
    """
    problems = []
    gateway = gateway_service_name(objs)
    for name, svc in _services(objs).items():
        spec = svc.get("spec", {})
        if spec.get("type", "ClusterIP") != "ClusterIP" or spec.get("externalIPs"):
            problems.append(f"Service/{name}: {spec.get('type')} exposes it outside the cluster")
    for rs in rayservices(objs):
        spec, rname = rs["spec"], rs["metadata"]["name"]
        serve = spec.get("serveService", {}).get("spec", {})
        if serve.get("type", "ClusterIP") not in ("ClusterIP", "LoadBalancer"):
            problems.append(f"RayService/{rname}: gateway Service type {serve.get('type')}")
        if serve.get("externalIPs") or (
            {p.get("port") for p in serve.get("ports", [])} - {GATEWAY_PORT}
        ):
            problems.append(
                f"RayService/{rname}: gateway Service exposes more than port {GATEWAY_PORT}"
            )
        head = spec.get("rayClusterConfig", {}).get("headGroupSpec", {})
        if head.get("serviceType", "ClusterIP") != "ClusterIP":
            problems.append(
                f"RayService/{rname}: head Service {head['serviceType']} exposes Ray's ports"
            )
        if head.get("headService", {}).get("spec", {}).get("type", "ClusterIP") != "ClusterIP":
            problems.append(f"RayService/{rname}: custom head Service is not ClusterIP")
        if head.get("enableIngress"):
            problems.append(f"RayService/{rname}: enableIngress publishes the Ray dashboard")
    for ing in (o for o in objs if o.get("kind") == "Ingress"):
        iname = ing["metadata"]["name"]
        backends = [ing["spec"]["defaultBackend"]] if ing["spec"].get("defaultBackend") else []
        for rule in ing["spec"].get("rules", []):
            backends += [p["backend"] for p in rule.get("http", {}).get("paths", [])]
        for b in backends:
            svc = b.get("service", {})
            port = svc.get("port", {})
            if svc.get("name") != gateway or port not in (
                {"number": GATEWAY_PORT},
                {"name": "serve"},
            ):
                problems.append(
                    f"Ingress/{iname}: backend {svc.get('name')}:{port} is not the gateway"
                )
    return problems


def _env_from_secret(container: dict, name: str) -> bool:
    for env in container.get("env", []):
        if env.get("name") == name:
            return "secretKeyRef" in (env.get("valueFrom") or {}) and "value" not in env
    return False


def secret_problems(objs: list[dict]) -> list[str]:
    """Redis without a password from a Secret, or a secret-looking value written in a manifest.

    Each Redis container must pass `requirepass ${REDIS_PASSWORD}` with REDIS_PASSWORD from a
    secretKeyRef; GCS fault tolerance must take the Redis password from a Secret; no container
    env var named like a password, token or key may carry a literal value.
    """
    problems = []
    workloads = [o for o in objs if o.get("kind") in ("Deployment", "StatefulSet")]
    containers = [
        (f"{o['kind']}/{o['metadata']['name']}", c)
        for o in workloads
        for c in workload_containers(o)
    ]
    for rs in rayservices(objs):
        for group, c in ray_containers(rs).items():
            containers.append((f"RayService/{rs['metadata']['name']}[{group}]", c))
        gcs = rs["spec"]["rayClusterConfig"].get("gcsFaultToleranceOptions")
        if gcs and "secretKeyRef" not in ((gcs.get("redisPassword") or {}).get("valueFrom") or {}):
            problems.append(
                f"RayService/{rs['metadata']['name']}: GCS Redis password not from a Secret"
            )
    redis = [(w, c) for w, c in containers if "redis" in str(c.get("image", "")).split("/")[-1]]
    if not redis:
        problems.append("no Redis container found")
    for where, c in redis:
        script = " ".join(c.get("command", []) + c.get("args", []))
        if "requirepass ${REDIS_PASSWORD}" not in script or not _env_from_secret(
            c, "REDIS_PASSWORD"
        ):
            problems.append(f"{where}: Redis without requirepass from a Secret")
    for where, c in containers:
        for env in c.get("env", []):
            # a literal value, unless it is built from other (secret) variables, like REDIS_URL
            literal = "value" in env and "$(" not in str(env["value"])
            if literal and _SECRET_NAME.search(env.get("name", "")):
                problems.append(f"{where}: {env['name']} has a literal value")
    return problems
