"""The `specserve up` the suite starts for itself (`UpProcess`): a subprocess on loopback and a
free port, with the suite's copy of a Serve config (a short engine_stall_s), its own cache
directory, SPECSERVE_FAULT_INJECTION=1 and an admin token; ready once a first request completes;
stopped with SIGTERM (then SIGKILL of what it left, after a bound)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import yaml
from pydantic import BaseModel, Field

from specserve.env import DEPLOYMENT_VARIABLES, EnvVar
from specserve.platform.state.redis_server import free_port
from specserve.tools.faults.traffic import Traffic, first_success

# this process's settings the suite's `up` must not inherit: it makes its own store and cache
NOT_INHERITED = ("RAY_ADDRESS", *DEPLOYMENT_VARIABLES)


class UpSettings(BaseModel):
    """How to start the suite's own `up`; `args` override the config's application args."""

    config: Path
    cache_dir: Path
    token: str
    port: int | None = None  # None: a free one
    num_cpus: int | None = None
    args: dict = Field(default_factory=dict)
    start_timeout_s: float = Field(600.0, gt=0)
    stop_timeout_s: float = Field(90.0, gt=0)


def fault_config(source: Path, target: Path, args: dict) -> Path:
    """`source` (a Serve config) with `args` merged into its application's args, at `target`."""
    config = yaml.safe_load(Path(source).read_text())
    (app,) = config["applications"]
    app["args"] = dict(app.get("args") or {}) | args
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(yaml.safe_dump(config, sort_keys=False))
    return target


def base_models(config: Path) -> list[str]:
    (app,) = yaml.safe_load(Path(config).read_text())["applications"]
    return list((app.get("args") or {}).get("models") or [])


class UpProcess:
    """One `specserve up` subprocess; `log_file` gets its output."""

    def __init__(self, settings: UpSettings) -> None:
        self.settings = settings
        self.port = settings.port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cache = settings.cache_dir
        self.config = fault_config(settings.config, cache / "faults-serve.yaml", settings.args)
        self.log_file = cache / "faults-up.log"
        self.proc: subprocess.Popen | None = None
        self.exit_code: int | None = None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def environment(self) -> dict[str, str]:
        """This process's environment without store or adapter-root settings (the up's own
        embedded store and cache), with fault injection on and the suite's admin token."""
        env = {k: v for k, v in os.environ.items() if k not in NOT_INHERITED}
        return env | {
            EnvVar.FAULT_INJECTION: "1",
            EnvVar.ADMIN_TOKEN: self.settings.token,
            EnvVar.CACHE: str(self.settings.cache_dir),
        }

    def command(self) -> list[str]:
        s = self.settings
        command = [sys.executable, "-m", "specserve.cli", "up", "--config", str(self.config)]
        command += ["--host", "127.0.0.1", "--port", str(self.port)]
        command += ["--cache-dir", str(s.cache_dir)]
        return command + (["--num-cpus", str(s.num_cpus)] if s.num_cpus else [])

    def start(self) -> UpProcess:
        self.settings.cache_dir.mkdir(parents=True, exist_ok=True)
        with self.log_file.open("ab") as out:
            self.proc = subprocess.Popen(
                self.command(),
                env=self.environment(),
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # a Ctrl-C of the suite is not the up's
            )
        return self

    def wait_ready(self, traffic: Traffic) -> float:
        """Seconds until a first request completes; RuntimeError if `up` exits or the start
        timeout passes first."""
        started, last = time.monotonic(), None
        while time.monotonic() - started < self.settings.start_timeout_s:
            if self.proc is None or self.proc.poll() is not None:
                raise RuntimeError(f"`specserve up` exited early: {self.log_tail()}")
            seconds, probes = first_success(traffic, time.monotonic(), 5.0, pause_s=1.0)
            if seconds is not None:
                return round(time.monotonic() - started, 3)
            last = probes[-1] if probes else last
        where = f"last probe: {last.outcome} {last.detail}" if last else "no probe"
        raise RuntimeError(
            f"`specserve up` not ready in {self.settings.start_timeout_s} s ({where})"
        )

    def log_tail(self, chars: int = 1500) -> str:
        try:
            return self.log_file.read_text(errors="replace")[-chars:]
        except OSError:
            return "(no log)"

    def terminate(self) -> None:
        """SIGTERM to `up` (its drain and teardown follow)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)

    def wait_exit(self, limit_s: float) -> int | None:
        """The exit code once `up` ends within `limit_s`, else None."""
        if self.proc is None:
            return self.exit_code
        try:
            self.exit_code = self.proc.wait(limit_s)
        except subprocess.TimeoutExpired:
            return None
        return self.exit_code

    def stop(self) -> int | None:
        """SIGTERM (a second one, if it is draining already), then, past the stop timeout, SIGKILL
        of `up`; then SIGKILL of whatever it left behind. `up`'s exit code (None: killed)."""
        if self.proc is None:
            return None
        left = self._descendants()
        self.terminate()
        code = self.wait_exit(self.settings.stop_timeout_s)
        if code is None:
            with contextlib.suppress(OSError):
                os.killpg(self.proc.pid, signal.SIGKILL)  # its own session: pgid == pid
            self.wait_exit(10.0)
        _, alive = psutil.wait_procs(left, timeout=10.0)
        for proc in alive:
            with contextlib.suppress(psutil.Error):
                proc.kill()
        psutil.wait_procs(alive, timeout=10.0)
        return code

    def _descendants(self) -> list[psutil.Process]:
        try:
            return psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.Error:
            return []
