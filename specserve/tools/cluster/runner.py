"""`run_demo(DemoSettings)`: a LocalCluster shaped like the RayService (k8s/base), the platform on
it as `specserve up` deploys it, the scenarios in order, then everything it started stopped; the
`Summary` (JSON) and timeline plot. `main(argv)` is scripts/cluster_demo.py's command line."""

from __future__ import annotations

import argparse
import json
import os
import platform
import secrets
import sys
import time
from pathlib import Path

import ray
from pydantic import BaseModel, Field

from specserve.env import EnvVar
from specserve.platform.rayserve import loopback
from specserve.platform.state.redis_server import EmbeddedRedis, free_port
from specserve.tools.cluster import app, gcs, observe, scenarios
from specserve.tools.cluster.figures import Machine, Summary
from specserve.tools.cluster.local import LocalCluster, wait_for
from specserve.tools.cluster.plot import plot_timeline
from specserve.tools.cluster.shape import ClusterShape
from specserve.tools.cluster.traffic import Recorder


class DemoSettings(BaseModel):
    """The demo's knobs. The delays shorten serve.yaml's ModelServer autoscaling_config and the
    RayService's idle timeout (same settings objects, smaller numbers) so a run takes minutes."""

    work_dir: Path
    bounds: scenarios.Bounds = scenarios.Bounds()
    upscale_delay_s: float = Field(3.0, ge=0)
    downscale_delay_s: float = Field(8.0, ge=0)
    idle_timeout_s: float = Field(10.0, gt=0)
    heartbeat_timeout_s: int = Field(10, ge=1, description="autoscaler: a silent node is lost")
    gcs_restart: bool = True
    gcs_outage_s: float = Field(8.0, gt=0)
    out: Path | None = None
    plot: Path | None = None


def machine() -> Machine:
    cpu = platform.processor() or "unknown"
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
        cpu = next(ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return Machine(cpu=cpu, cores=os.cpu_count() or 0, ray=ray.__version__)


def run_demo(settings: DemoSettings, command: str = "", log=print) -> Summary:
    work = settings.work_dir
    shape = ClusterShape.from_manifest().model_copy(
        update={"idle_timeout_s": settings.idle_timeout_s}
    )
    model_dir = app.make_tiny_model(work / "model")
    (work / "adapters").mkdir(parents=True, exist_ok=True)
    redis = EmbeddedRedis(start_timeout_s=20).start()
    token, port = secrets.token_urlsafe(16), free_port()
    env = _environment(settings, redis.url, token, work, free_port())
    cluster = LocalCluster(shape, work, env, gcs_redis=(f"127.0.0.1:{redis.port}", redis.password))
    try:
        cluster.start()
        log(f"head up at {cluster.address}; Ray's fake provider adds workers of {shape.workers}")
        return _run(settings, cluster, shape, env, model_dir, token, port, command, log)
    finally:
        _shutdown(cluster, redis, log)


def _environment(
    settings: DemoSettings, redis_url: str, token: str, work: Path, worker_port: int
) -> dict[str, str]:
    return {
        EnvVar.REDIS_URL: redis_url.rsplit("/", 1)[0] + "/1",  # db 0: the GCS's tables, as on k8s
        EnvVar.ADMIN_TOKEN: token,
        EnvVar.CACHE: str(work / "cache"),
        EnvVar.ADAPTER_ROOT: str(work / "adapters"),
        # worker nodes' proxies on their own port: clients use the head's, as an ingress would
        "RAY_SERVE_WORKER_PROXY_HTTP_PORT": str(worker_port),
        "AUTOSCALER_HEARTBEAT_TIMEOUT_S": str(settings.heartbeat_timeout_s),
        **loopback.env_for("127.0.0.1"),
    }


def _run(settings, cluster, shape, env, model_dir, token, port, command, log) -> Summary:
    loopback.confine_to("127.0.0.1")  # ray is imported already: confine_to sees to that
    os.environ.update(env)
    runtime_env = {"env_vars": env, **loopback.runtime_env_for("127.0.0.1")}
    ray.init(address=cluster.address, runtime_env=runtime_env, log_to_driver=False)
    started = time.monotonic()
    min_workers = sum(t.min_workers for t in shape.workers.values())
    wait_for(lambda: sum(not n.head for n in cluster.nodes()) >= min_workers, 120)
    overrides = app.ScalingOverrides(
        upscale_delay_s=settings.upscale_delay_s, downscale_delay_s=settings.downscale_delay_s
    )
    args, deployments = app.serve_app_config(model_dir, settings.work_dir / "adapters", overrides)
    app.deploy(args, deployments, port)
    log(f"platform up on http://127.0.0.1:{port} after {time.monotonic() - started:.0f} s")
    summary = Summary(
        command=command,
        machine=machine(),
        settings=settings.model_dump(mode="json"),
        serve_autoscaling=app.server_scaling(deployments),
        cluster=shape.model_dump(),
    )
    _scenarios(
        settings, summary, cluster, f"http://127.0.0.1:{port}", token, model_dir, min_workers, log
    )
    summary.seconds = round(time.monotonic() - started, 1)
    return summary


def _scenarios(settings, summary, cluster, url, token, model_dir, min_workers, log) -> None:
    recorder = Recorder()
    timeline = observe.Timeline(
        recorder.results, recorder.in_flight, lambda: sum(not n.head for n in cluster.nodes())
    ).start()
    run = scenarios.Run(
        cluster,
        url,
        token,
        model_dir,
        settings.work_dir / "adapters",
        settings.bounds,
        timeline,
        recorder,
    )
    load = None
    try:
        load, summary.scale = scenarios.ramp_up(run)
        log(f"scale-out: {summary.scale.model_dump_json()}")
        summary.pool = _guard(summary, "pool", lambda: scenarios.pool_across_nodes(run))
        log(f"pool: {summary.pool.model_dump_json() if summary.pool else None}")
        summary.kill = _guard(summary, "kill", lambda: scenarios.kill_node(run))
        log(f"node kill: {summary.kill.model_dump_json() if summary.kill else None}")
        summary.scale = scenarios.ramp_down(run, load, summary.scale, min_workers)
        load = None
        log(f"scale-in: {summary.scale.model_dump_json()}")
        if settings.gcs_restart:
            summary.gcs = _guard(
                summary, "gcs", lambda: gcs.restart_gcs(run, settings.gcs_outage_s)
            )
            log(f"gcs: {summary.gcs.model_dump_json() if summary.gcs else None}")
    finally:
        if load is not None:
            load.stop(wait=False)
        summary.timeline = timeline.stop()


def _guard(summary: Summary, name: str, scenario):
    """Run one scenario; an exception is recorded in the summary, and the run goes on."""
    try:
        return scenario()
    except Exception as err:  # noqa: BLE001 - one failed scenario must not hide the others
        summary.errors.append(f"{name}: {type(err).__name__}: {err}")
        return None


def _shutdown(cluster: LocalCluster, redis, log) -> None:
    ray.shutdown()
    stopped = cluster.stop()
    redis.stop()
    log(f"stopped {stopped} cluster processes and the Redis")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work-dir", type=Path, default=Path("cluster-demo"))
    parser.add_argument("--out", type=Path, help="the JSON summary (default: WORK/summary.json)")
    parser.add_argument("--plot", type=Path, help="the timeline as PNG (matplotlib)")
    parser.add_argument("--clients", type=int, default=scenarios.Bounds().clients)
    parser.add_argument("--no-gcs", action="store_true", help="skip the GCS restart")
    ns = parser.parse_args(argv)
    settings = DemoSettings(
        work_dir=ns.work_dir.resolve(),
        out=ns.out,
        plot=ns.plot,
        bounds=scenarios.Bounds(clients=ns.clients),
        gcs_restart=not ns.no_gcs,
    )
    summary = run_demo(settings, command=" ".join(["python", *sys.argv]))
    out = settings.out or settings.work_dir / "summary.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(summary.model_dump_json(indent=1))
    if settings.plot:
        plot_timeline(summary, settings.plot)
    targets = summary.targets()
    print(
        json.dumps(
            {
                "summary": str(out),
                "seconds": summary.seconds,
                "targets": targets,
                "errors": summary.errors,
            },
            indent=1,
        )
    )
    return 0 if all(targets.values()) and not summary.errors else 1
