"""Every check of a rendered overlay (`problems`) and the command (`main`)."""

from __future__ import annotations

import sys

from scripts.k8s_validate.exposure import exposure_problems, secret_problems
from scripts.k8s_validate.kuberay import drain_problems, kuberay_problems
from scripts.k8s_validate.render import OVERLAYS, overlays, render
from scripts.k8s_validate.schemas import schema_problems


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
