"""The demo's timeline as a PNG (matplotlib): ModelServer replicas and worker nodes against the
requests in flight, p50/p99 latency per second, phases shaded and named."""

from __future__ import annotations

from pathlib import Path

from specserve.tools.cluster.figures import Summary


def plot_timeline(summary: Summary, path: Path) -> Path:
    import matplotlib  # lazy: matplotlib is optional (the `plot` extra): only --plot needs it

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # lazy: after use("Agg"), and optional as above

    samples = [s for s in summary.timeline if s.replicas >= 0]
    t = [s.t for s in samples]
    fig, (top, bottom) = plt.subplots(2, 1, sharex=True, figsize=(10, 6), height_ratios=(3, 2))
    top.step(t, [s.replicas for s in samples], where="post", label="ModelServer replicas")
    top.step(t, [s.nodes for s in samples], where="post", label="worker nodes", linestyle="--")
    top.set_ylabel("count")
    load = top.twinx()
    load.plot(t, [s.in_flight for s in samples], color="grey", alpha=0.5, label="in flight")
    load.set_ylabel("requests in flight")
    top.legend(loc="upper left")
    load.legend(loc="upper right")
    bottom.plot(t, [s.p50_s for s in samples], ".", label="p50 latency")
    bottom.plot(t, [s.p99_s for s in samples], ".", label="p99 latency")
    failed = [s for s in samples if s.errors]
    bottom.plot(
        [s.t for s in failed],
        [s.errors for s in failed],
        "x",
        color="red",
        label="requests ended with an error (count)",
    )
    bottom.set_xlabel("seconds")
    bottom.set_ylabel("seconds / errors")
    bottom.legend(loc="upper left")
    _phases(top, samples)
    fig.suptitle(f"cluster demo on {summary.machine.cpu} ({summary.machine.cores} cores)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _phases(axis, samples) -> None:
    """A label where each phase starts."""
    last = None
    for s in samples:
        if s.phase != last:
            axis.axvline(s.t, color="black", alpha=0.2)
            axis.text(s.t, axis.get_ylim()[1] * 0.95, f" {s.phase}", fontsize=7, va="top")
            last = s.phase
