"""Objects against their schemas: ray.io ones against the vendored KubeRay CRDs (closed to unknown
fields), the rest against Kubernetes' own (`kubernetes_validate`) of the oldest release targeted."""

from __future__ import annotations

import functools

import jsonschema
import kubernetes_validate
import yaml

from scripts.k8s_validate.render import LOADER, ROOT

KUBERAY_SCHEMAS = ROOT / "k8s" / "schemas" / "kuberay"
CRD_FILES = {"RayService": "ray.io_rayservices.yaml", "RayCluster": "ray.io_rayclusters.yaml"}
K8S_VERSION = "1.30"  # oldest Kubernetes the manifests target; core schemas of that release


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
        crd = yaml.load(f, Loader=LOADER)
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    return _closed(version["schema"]["openAPIV3Schema"])


def _errors(validator, instance, where: str) -> list[str]:
    return [
        f"{where}: {'.'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}"
        for e in sorted(validator.iter_errors(instance), key=lambda e: list(map(str, e.path)))
    ]


def schema_problems(obj: dict) -> list[str]:
    """Problems of one object against its schema: KubeRay CRD for ray.io, Kubernetes' otherwise."""
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
    try:
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
    except kubernetes_validate.ValidationError as e:
        return [f"{name}: {'.'.join(map(str, e.path)) or '<root>'}: {e.message}"]
    except kubernetes_validate.SchemaNotFoundError as e:
        return [f"{name}: {e.message}"]
    return []
