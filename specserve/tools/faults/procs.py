"""Finding the platform's processes with psutil: within a `Scope` (the descendants of the `up`
the suite started, else this machine's whole table, narrowed to one cache directory when known),
by title (Ray's `ray::ServeReplica:...`), the embedded redis-server by its directory, and the
store URLs a server process was given; `kill` sends SIGKILL and waits for the process to go."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import psutil
from pydantic import BaseModel

from specserve.env import EnvVar

REPLICA_TITLE = "ServeReplica:specserve:ModelServer"
CONTROLLER_TITLE = "ray::ServeController"
STORE_VARIABLES = (EnvVar.REDIS_URL, EnvVar.POOL_REDIS_URL)
_GONE = (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess)


class Scope(BaseModel):
    """Where to look: under `root_pid` (with it), else everywhere; `cache_dir`: the `up`'s cache
    (its redis lives in `<cache>/redis`; Ray workers carry SPECSERVE_CACHE in their environment)."""

    root_pid: int | None = None
    cache_dir: Path | None = None


def candidates(scope: Scope) -> list[psutil.Process]:
    """The processes in `scope`, this one excluded."""
    if scope.root_pid is not None:
        try:
            root = psutil.Process(scope.root_pid)
            found = [root, *root.children(recursive=True)]
        except _GONE:
            return []
    else:
        found = list(psutil.process_iter())
    return [p for p in found if p.pid != os.getpid()]


def title(proc: psutil.Process) -> str:
    """Name and command line as one string ('' once the process is gone)."""
    try:
        return " ".join([proc.name(), *proc.cmdline()])
    except _GONE:
        return ""


def _in_cache(proc: psutil.Process, cache_dir: Path | None) -> bool:
    """The process was started for `cache_dir` (always, when it is None or the process has no
    SPECSERVE_CACHE)."""
    if cache_dir is None:
        return True
    try:
        where = proc.environ().get(EnvVar.CACHE)
    except _GONE:
        return False
    return where is None or Path(where).resolve() == Path(cache_dir).resolve()


def by_title(scope: Scope, needle: str) -> list[psutil.Process]:
    """Processes in `scope` whose name or command line contains `needle`."""
    return [p for p in candidates(scope) if needle in title(p) and _in_cache(p, scope.cache_dir)]


def replicas(scope: Scope, title_part: str = REPLICA_TITLE) -> list[psutil.Process]:
    return by_title(scope, title_part)


def controllers(scope: Scope) -> list[psutil.Process]:
    return by_title(scope, CONTROLLER_TITLE)


def _under(path: str, root: Path) -> bool:
    try:
        return Path(path).resolve().is_relative_to(root.resolve())
    except (OSError, ValueError):
        return False


def redis_servers(scope: Scope, redis_dir: Path | None = None) -> list[psutil.Process]:
    """redis-server processes in `scope`; with `redis_dir`, only those whose working directory
    (redis chdirs to its `dir`) or an argument lies under it."""
    found = []
    for proc in candidates(scope):
        if "redis-server" not in title(proc):
            continue
        if redis_dir is None:
            found.append(proc)
            continue
        try:
            places = [proc.cwd(), *proc.cmdline()[1:]]
        except _GONE:
            continue
        if any(_under(place, redis_dir) for place in places if place):
            found.append(proc)
    return found


def listens_on(proc: psutil.Process, port: int) -> bool:
    """The process holds a listening TCP socket on `port`."""
    try:
        sockets = proc.net_connections(kind="tcp")
    except _GONE:
        return False
    return any(c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port for c in sockets)


def store_urls(proc: psutil.Process) -> dict[str, str]:
    """The store URLs in a server process's environment (REDIS_URL, SPECSERVE_POOL_REDIS_URL)."""
    try:
        env = proc.environ()
    except _GONE:
        return {}
    return {name: env[name] for name in STORE_VARIABLES if env.get(name)}


def only(found: list[psutil.Process], what: str) -> psutil.Process:
    """The one process of `found`; LookupError naming `what` when there are none or several."""
    if len(found) != 1:
        pids = [p.pid for p in found]
        raise LookupError(f"{what}: expected one process, found {len(found)} {pids}")
    return found[0]


def kill(proc: psutil.Process, wait_s: float = 10.0) -> bool:
    """SIGKILL `proc` and wait for it to end; False if it was already gone."""
    try:
        proc.send_signal(signal.SIGKILL)
    except _GONE:
        return False
    try:
        proc.wait(wait_s)
    except psutil.TimeoutExpired:
        pass
    except _GONE:
        pass
    return True
