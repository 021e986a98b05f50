"""Where specserve's files are: the configs packaged with it (`config_file`), the default cache
(`default_cache_dir`) and, for the deployment tooling only, the source checkout (`repo_root`)."""

from __future__ import annotations

import os
from pathlib import Path

from specserve.env import EnvVar

PACKAGE_DIR = Path(__file__).resolve().parent
CONFIG_DIR = PACKAGE_DIR / "configs"


def config_file(name: str) -> Path:
    """A config shipped inside the package (serve.yaml, policy.yaml, models.yaml); works from a
    wheel as from a checkout. Unknown names fail with the list of shipped ones."""
    path = CONFIG_DIR / name
    if not path.is_file():
        shipped = sorted(p.name for p in CONFIG_DIR.glob("*.yaml"))
        raise FileNotFoundError(f"no packaged config {name!r}; shipped: {', '.join(shipped)}")
    return path


def default_cache_dir() -> Path:
    """$SPECSERVE_CACHE, else ~/.cache/specserve."""
    env = os.environ.get(EnvVar.CACHE)
    if env:
        return Path(env).expanduser()
    return Path.home() / ".cache" / "specserve"


def repo_root() -> Path:
    """The source checkout (it has k8s/ and pyproject.toml): the package's parent when specserve
    runs from one, else the working directory or one above it. For k8s tooling, never serving."""
    cwd = Path.cwd().resolve()
    candidates = [PACKAGE_DIR.parent, cwd, *cwd.parents]
    for root in candidates:
        if (root / "pyproject.toml").is_file() and (root / "k8s").is_dir():
            return root
    raise FileNotFoundError(
        "no specserve checkout (pyproject.toml beside k8s/) above the package or the working "
        f"directory {Path.cwd()}; run the k8s tooling from a clone"
    )
