"""The `plot` of a load report: a small PNG of throughput and ITL p50 against concurrency, one
line per mode (matplotlib, imported only here)."""

from __future__ import annotations


def plot(report: dict, path) -> None:
    """A small PNG: throughput and ITL p50 against concurrency (log2), one line per mode."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # lazy: the optional `plot` extra
    from matplotlib.figure import Figure  # lazy: the optional `plot` extra, only for --plot

    fig = Figure(figsize=(6, 3.5), dpi=80)
    FigureCanvasAgg(fig)
    panels = fig.subplots(1, 2)
    results = report.get("results", {})
    concurrencies = sorted({int(c) for by_level in results.values() for c in by_level})
    for ax, key, label in zip(
        panels, ("throughput_tok_s", "itl_p50_s"), ("throughput (tok/s)", "ITL p50 (s)")
    ):
        for mode, by_level in results.items():
            points = sorted((int(c), s.get(key)) for c, s in by_level.items())
            points = [(c, v) for c, v in points if v is not None]
            if points:
                ax.plot(*zip(*points), marker="o", label=mode)
        ax.set_xscale("log", base=2)
        ax.set_xticks(concurrencies, [str(c) for c in concurrencies])
        ax.minorticks_off()
        ax.set_xlabel("concurrency")
        ax.set_title(label, fontsize=10)
        ax.grid(alpha=0.3)
    if panels[0].get_legend_handles_labels()[0]:
        panels[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=80, format="png")
