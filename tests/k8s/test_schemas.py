"""The vendored KubeRay CRDs are the pinned upstream files, identical to ../shared's copy."""

from __future__ import annotations

import hashlib

import pytest

from scripts.k8s_validate import schemas
from scripts.k8s_validate.render import ROOT

BLOBS = {  # git blob ids of kuberay commit feeaf72f (k8s/schemas/kuberay/README.md)
    "ray.io_rayservices.yaml": "7ee63d6ddd11237a5649e04b3a8db3c52074c867",
    "ray.io_rayclusters.yaml": "ff0be58ada3bd457605eff1f258c16df21e61e21",
}
SHARED = ROOT.parent / "shared" / "schemas" / "kuberay"


def _blob(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@pytest.mark.parametrize("name", sorted(BLOBS))
def test_vendored_crd_is_pinned_upstream_file(name):
    assert _blob((schemas.KUBERAY_SCHEMAS / name).read_bytes()) == BLOBS[name]


@pytest.mark.skipif(not SHARED.is_dir(), reason="no ../shared/schemas/kuberay beside this clone")
@pytest.mark.parametrize("name", sorted(BLOBS))
def test_vendored_crd_equals_shared(name):
    assert (schemas.KUBERAY_SCHEMAS / name).read_bytes() == (SHARED / name).read_bytes()


def test_crd_schemas_are_closed_to_unknown_fields():
    spec = schemas.crd_schema("RayService")["properties"]["spec"]
    assert spec["additionalProperties"] is False
    # maps stay maps: rayStartParams takes any key
    head = spec["properties"]["rayClusterConfig"]["properties"]["headGroupSpec"]
    assert head["properties"]["rayStartParams"]["additionalProperties"] == {"type": "string"}
