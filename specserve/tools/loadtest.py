"""`specserve loadtest`: drive a running server with concurrent streaming chat requests spread over
variants, per concurrency level and mode (`ar` forced, `spec` = lookahead forced, `policy`), and
report throughput, TTFT and inter-token latency percentiles, τ and failures as JSON.

Optional reports, each a top-level key of the same JSON:

- `overload` (`run_overload`): more clients than capacity, back to back for a while; how many
  requests were admitted, completed, refused (503/429: how fast, with Retry-After?) or failed,
  how long the gateway's in-flight count took to drain, and the KV positions reserved meanwhile.
- `disconnect` (`run_disconnect`): streams cut abruptly after a few tokens; how long until the
  gateway's in-flight count and the replicas' batch (decoding + waiting + prefilling) reach zero.
- `plot` (`plot`): a PNG of throughput and ITL p50 against concurrency, one line per mode.
"""

from __future__ import annotations

import concurrent.futures
import http.client
import json
import multiprocessing
import random
import re
import socket
import statistics
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field

from specserve.platform.api.metrics import LOOP_TOTALS

MODES = {
    "ar": "ar",
    "spec": "lookahead",
    "policy": None,
}  # mode -> strategy forced on every variant


@dataclass
class Sample:
    ok: bool
    tokens: int = 0
    ttft: float | None = None
    itl: float | None = None  # mean seconds per token after the first chunk
    tau: float | None = None
    error: str = ""


@dataclass
class Level:
    samples: list[Sample] = field(default_factory=list)
    seconds: float = 0.0


def interleave_tasks(rows: list[dict]) -> list[str]:
    """First-turn prompts taking each Spec-Bench task in turn, so every load level sees the mix.

    Example: tasks a a b c c -> prompts of a, b, c, a, c (each task's own order kept).
    """
    by_task: dict[str, list[str]] = {}
    for row in rows:
        by_task.setdefault(row.get("task") or row.get("category") or "", []).append(row["turns"][0])
    queues = list(by_task.values())
    out = []
    for i in range(max(map(len, queues), default=0)):
        out += [q[i] for q in queues if i < len(q)]
    return out


def level_requests(requests: int, rounds: int, concurrency: int, cycle: int) -> int:
    """Requests at one load level: at least `requests` and `rounds` per stream, rounded up to
    whole cycles of the interleaved tasks, so every level gets the same task mix (a level of 8
    over 6 tasks would hold two extra short prompts and flatter one-at-a-time throughput).

    Example: requests 8, rounds 3, concurrency 1, 6 tasks -> 12; concurrency 16 -> 48.
    """
    count = max(requests, rounds * concurrency, 1)
    return -(-count // max(cycle, 1)) * max(cycle, 1)


def percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile. Example: [1, 2, 3, 4] at 0.5 -> 2; at 0.99 -> 4."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, min(len(ordered), int(-(-q * len(ordered) // 1))))
    return ordered[rank - 1]


def _connect(url: str, timeout: float) -> http.client.HTTPConnection:
    parts = urllib.parse.urlsplit(url)
    return http.client.HTTPConnection(parts.hostname, parts.port or 80, timeout=timeout)


def _post_chat(
    conn: http.client.HTTPConnection, model: str, prompt: str, max_tokens: int, token: str | None
) -> None:
    """Send one streaming chat completion request (greedy, usage in the last chunk)."""
    body = {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    headers = {"Content-Type": "application/json"} | (
        {"Authorization": f"Bearer {token}"} if token else {}
    )
    conn.request("POST", "/v1/chat/completions", json.dumps(body), headers)


def _event(raw: bytes) -> dict | str | None:
    """One SSE line: its JSON chunk, "DONE" for `data: [DONE]`, None for anything else."""
    line = raw.decode().strip()
    if not line.startswith("data: "):
        return None
    return "DONE" if line == "data: [DONE]" else json.loads(line[6:])


def _has_content(chunk: dict) -> bool:
    return any(c.get("delta", {}).get("content") for c in chunk.get("choices", []))


def stream_chat(
    url: str,
    model: str,
    prompt: str,
    max_tokens: int,
    timeout: float = 600.0,
    token: str | None = None,
) -> Sample:
    """One streaming chat request; times the first content chunk and the rest."""
    conn = _connect(url, timeout)
    started = time.perf_counter()
    try:
        _post_chat(conn, model, prompt, max_tokens, token)
        resp = conn.getresponse()
        if resp.status != 200:
            return Sample(False, error=f"HTTP {resp.status}: {resp.read()[:200]!r}")
        first = last = None
        tokens, tau = 0, None
        for raw in resp:
            chunk = _event(raw)
            if not isinstance(chunk, dict):
                continue
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
            if chunk.get("specserve"):
                tau = chunk["specserve"].get("tau")
            if _has_content(chunk):
                now = time.perf_counter()
                first = first or now
                last = now
        ttft = (first - started) if first else None
        itl = (last - first) / (tokens - 1) if first and tokens > 1 else None
        return Sample(True, tokens, ttft, itl, tau)
    except (OSError, http.client.HTTPException, json.JSONDecodeError) as err:
        return Sample(False, error=f"{type(err).__name__}: {err}")
    finally:
        conn.close()


def run_level(
    url: str,
    models: list[str],
    prompts: list[str],
    concurrency: int,
    requests: int,
    max_tokens: int,
    first_prompt: int = 0,
) -> Level:
    """`requests` requests with `concurrency` in flight, round-robin over models, taking prompts
    from `first_prompt` on (so levels of a run need not repeat prompts)."""
    level, lock, next_i = Level(), threading.Lock(), [0]

    def worker() -> None:
        while True:
            with lock:
                i = next_i[0]
                if i >= requests:
                    return
                next_i[0] += 1
            sample = stream_chat(
                url, models[i % len(models)], prompts[(first_prompt + i) % len(prompts)], max_tokens
            )
            with lock:
                level.samples.append(sample)

    started = time.perf_counter()
    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    level.seconds = time.perf_counter() - started
    return level


def summarize(level: Level) -> dict:
    ok = [s for s in level.samples if s.ok]
    tokens = sum(s.tokens for s in ok)
    ttfts = [s.ttft for s in ok if s.ttft is not None]
    itls = [s.itl for s in ok if s.itl is not None]
    taus = [s.tau for s in ok if s.tau]
    r = lambda v: None if v is None else round(v, 4)
    return {
        "throughput_tok_s": round(tokens / level.seconds, 2) if level.seconds else 0.0,
        "ttft_p50_s": r(percentile(ttfts, 0.5)),
        "ttft_p99_s": r(percentile(ttfts, 0.99)),
        "itl_p50_s": r(percentile(itls, 0.5)),
        "itl_p99_s": r(percentile(itls, 0.99)),
        "tau": round(statistics.mean(taus), 3) if taus else None,
        "failed": len(level.samples) - len(ok),
    }


# -- server figures: /healthz and /metrics

_PROM_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)")
_PROM_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')
ACTIVE_FIGURES = ("decoding", "waiting", "prefilling")


def prom_values(text: str, name: str, labels: dict[str, str] | None = None) -> list[float]:
    """Values of metric `name` whose labels include `labels`, from Prometheus text.

    Example: 'm{a="x",b="y"} 3.0' with name "m", labels {"a": "x"} -> [3.0].
    """
    out = []
    for line in text.splitlines():
        match = _PROM_LINE.match(line.strip())
        if not match or match.group(1) != name:
            continue
        found = {
            k: v.replace('\\"', '"').replace("\\\\", "\\")
            for k, v in _PROM_LABEL.findall(match.group(2) or "")
        }
        if all(found.get(k) == v for k, v in (labels or {}).items()):
            out.append(float(match.group(3)))
    return out


def batch_active(text: str) -> float:
    """Requests the replicas hold: decoding + waiting + prefilling (unknown figures, -1, skipped)."""
    return sum(
        v
        for figure in ACTIVE_FIGURES
        for v in prom_values(text, "specserve_replica_batch", {"figure": figure})
        if v >= 0
    )


def kv_reserved(text: str) -> float | None:
    """The largest `kv_reserved_tokens` over replicas; None when no replica reports one."""
    values = prom_values(text, "specserve_replica_batch", {"figure": "kv_reserved_tokens"})
    values = [v for v in values if v >= 0]
    return max(values) if values else None


def engine_figures(text: str | None) -> dict[str, float] | None:
    """The replicas' cumulative engine-loop figures, summed over replicas; None when unknown."""
    if text is None:
        return None
    sums = {}
    for figure in LOOP_TOTALS:
        values = prom_values(text, "specserve_replica_batch", {"figure": figure})
        if not values or min(values) < 0:
            return None
        sums[figure] = sum(values)
    return sums


def engine_share(before: dict | None, after: dict | None, seconds: float) -> dict | None:
    """Where a level's wall time went in the engine loop, from figures scraped around it.

    Example: 100 decode steps of 16 rows in 12 s and 4,000 prompt tokens in 6 s over 20 s ->
    busy 0.9, decode 120 ms per step at 16 rows, prefill 1.5 ms per prompt token.
    """
    if before is None or after is None or seconds <= 0:
        return None
    d = {k: after[k] - before[k] for k in LOOP_TOTALS}
    steps, tokens = d["decode_steps"], d["prefill_tokens"]
    return {
        "busy_fraction": round((d["decode_seconds"] + d["prefill_seconds"]) / seconds, 3),
        "decode_steps": int(steps),
        "rows_per_step": round(d["decode_rows"] / steps, 2) if steps else None,
        "decode_ms_per_step": round(1000 * d["decode_seconds"] / steps, 1) if steps else None,
        "prefill_ms_per_token": round(1000 * d["prefill_seconds"] / tokens, 2) if tokens else None,
        "prefill_fraction": round(d["prefill_seconds"] / seconds, 3),
    }


def fetch(url: str, path: str, timeout: float = 10.0) -> str | None:
    """GET `path` as text; None on any error (the probes treat that as 'not known')."""
    try:
        with urllib.request.urlopen(url.rstrip("/") + path, timeout=timeout) as resp:
            return resp.read().decode()
    except (OSError, http.client.HTTPException, ValueError):
        return None


def gateway_inflight(url: str) -> int | None:
    """The gateway's in-flight requests, summed over base models (`/healthz`)."""
    text = fetch(url, "/healthz")
    try:
        return sum(json.loads(text)["inflight"].values()) if text else None
    except (ValueError, KeyError, TypeError, AttributeError):
        return None


def replica_active(url: str) -> float | None:
    """`batch_active` of a fresh `/metrics` scrape; None when it cannot be read."""
    text = fetch(url, "/metrics")
    return None if text is None else batch_active(text)


def replica_kv_reserved(url: str) -> float | None:
    """`kv_reserved` of a fresh `/metrics` scrape."""
    text = fetch(url, "/metrics")
    return None if text is None else kv_reserved(text)


def seconds_to_zero(
    probes: dict[str, Callable[[], float | None]],
    poll_s: float,
    limit_s: float = 30.0,
    started: float | None = None,
) -> dict[str, float | None]:
    """Poll each probe every `poll_s` until it reads 0; seconds it took, None past `limit_s`.

    Seconds count from `started` (a `time.perf_counter()` reading; default: now).
    """
    started = time.perf_counter() if started is None else started
    out: dict[str, float | None] = {name: None for name in probes}
    while True:
        elapsed = time.perf_counter() - started
        for name, probe in probes.items():
            if out[name] is None and probe() == 0:
                out[name] = round(elapsed, 3)
        if all(v is not None for v in out.values()) or elapsed > limit_s:
            return out
        time.sleep(poll_s)


# -- overload: more clients than capacity, back to back


@dataclass
class Attempt:
    status: str  # "completed" | "refused" (503/429) | "failed"
    admitted: bool = False  # got HTTP 200
    refused_s: float | None = None  # send -> status line, for refusals
    retry_after: bool = False
    retry_after_s: float = 0.0  # the header's value (0 when absent or not a number)
    error: str = ""
    refused_by: str = ""  # "gateway" (its own bound, before any model server) or "replica"


def attempt_chat(
    url: str,
    model: str,
    prompt: str,
    max_tokens: int,
    timeout: float = 600.0,
    token: str | None = None,
) -> Attempt:
    """One streaming request, classified: completed only with the final `[DONE]`."""
    conn, resp = _connect(url, timeout), None
    started = time.perf_counter()
    try:
        _post_chat(conn, model, prompt, max_tokens, token)
        resp = conn.getresponse()
        if resp.status in (429, 503):
            seconds = time.perf_counter() - started
            header = resp.getheader("Retry-After") or ""
            wait = float(header) if header.replace(".", "", 1).isdigit() else 0.0
            by = "gateway" if b"is at capacity" in resp.read(4096) else "replica"
            return Attempt(
                "refused",
                refused_s=seconds,
                retry_after=bool(header),
                retry_after_s=wait,
                refused_by=by,
            )
        if resp.status != 200:
            return Attempt("failed", error=f"HTTP {resp.status}")
        done = any(_event(raw) == "DONE" for raw in resp)
        return Attempt("completed" if done else "failed", True, error="" if done else "no [DONE]")
    except (OSError, http.client.HTTPException, json.JSONDecodeError) as err:
        admitted = resp is not None and resp.status == 200
        return Attempt("failed", admitted, error=f"{type(err).__name__}: {err}")
    finally:
        conn.close()


def summarize_overload(attempts: list[Attempt]) -> dict:
    """Counts, refusal latency percentiles and the share of refusals carrying Retry-After."""
    refused = [a for a in attempts if a.status == "refused"]
    latencies = [a.refused_s for a in refused if a.refused_s is not None]
    r = lambda v: None if v is None else round(v, 4)
    return {
        "admitted": sum(a.admitted for a in attempts),
        "completed": sum(a.status == "completed" for a in attempts),
        "refused": len(refused),
        "failed": sum(a.status == "failed" for a in attempts),
        "refused_latency_p50_s": r(percentile(latencies, 0.5)),
        "refused_latency_p99_s": r(percentile(latencies, 0.99)),
        "refused_latency_max_s": r(max(latencies, default=None)),
        "retry_after_present": (
            round(sum(a.retry_after for a in refused) / len(refused), 4) if refused else None
        ),
        "refused_by": {
            by: {
                "count": len(mine),
                "latency_p50_s": r(percentile(mine, 0.5)),
                "latency_p99_s": r(percentile(mine, 0.99)),
            }
            for by in sorted({a.refused_by for a in refused if a.refused_by})
            if (mine := [a.refused_s for a in refused if a.refused_by == by])
        },
    }


def _sample_kv(url: str, stop: threading.Event, poll_s: float, seen: list[float]) -> None:
    """Every `poll_s` until `stop`: append the replicas' largest reserved KV positions."""
    while not stop.wait(poll_s):
        value = replica_kv_reserved(url)
        if value is not None:
            seen.append(value)


def _hammer(
    url: str,
    models: list[str],
    prompts: list[str],
    clients: int,
    seconds: float,
    max_tokens: int,
    timeout: float,
    ramp_s: float = 1.0,
) -> list[Attempt]:
    """`clients` threads sending back to back until `seconds` pass; every attempt made. Clients
    start evenly over the first `ramp_s`, at most a quarter of the window (a ramp-up: started all
    at once, the first refusals wait behind every admission of the same instant). After a
    refusal a client waits its Retry-After plus up to half as much again (jitter, as
    well-behaved clients do)."""
    attempts: list[Attempt] = []
    lock, next_i = threading.Lock(), [0]
    start = time.perf_counter()
    deadline = start + seconds
    ramp_s = min(ramp_s, seconds / 4)  # every client gets most of the window

    def client(seed: int) -> None:
        jitter = random.Random(seed)
        time.sleep(max(0.0, start + ramp_s * seed / clients - time.perf_counter()))
        while time.perf_counter() < deadline:
            with lock:
                i = next_i[0]
                next_i[0] += 1
            attempt = attempt_chat(
                url, models[i % len(models)], prompts[i % len(prompts)], max_tokens, timeout
            )
            with lock:
                attempts.append(attempt)
            if attempt.status == "refused":  # a well-behaved client honours Retry-After
                wait = attempt.retry_after_s * (1.0 + 0.5 * jitter.random())
                time.sleep(max(0.0, min(wait, deadline - time.perf_counter())))

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return attempts


def _hammer_in_processes(
    url: str,
    models: list[str],
    prompts: list[str],
    clients: int,
    seconds: float,
    max_tokens: int,
    timeout: float,
    processes: int,
) -> list[Attempt]:
    """`_hammer` split over `processes` processes (each its share of the clients and its own
    rotation of the prompts), so one interpreter's lock does not delay the replies it times."""
    shares = [clients // processes + (i < clients % processes) for i in range(processes)]
    jobs = [
        (url, models, prompts[i:] + prompts[:i], share, seconds, max_tokens, timeout)
        for i, share in enumerate(shares)
        if share
    ]
    spawn = multiprocessing.get_context("spawn")  # no fork of a process holding threads
    with concurrent.futures.ProcessPoolExecutor(len(jobs), mp_context=spawn) as pool:
        return [a for part in pool.map(_hammer, *zip(*jobs, strict=True)) for a in part]


def run_overload(
    url: str,
    models: list[str],
    prompts: list[str],
    clients: int,
    seconds: float,
    max_tokens: int,
    timeout: float = 600.0,
    kv_poll_s: float = 1.0,
    processes: int = 1,
) -> dict:
    """The `overload` report: `clients` back-to-back streams for `seconds` (from `processes`
    client processes), then the drain."""
    kv_before = replica_kv_reserved(url)
    stop, kv_seen = threading.Event(), []
    sampler = threading.Thread(target=_sample_kv, args=(url, stop, kv_poll_s, kv_seen))
    sampler.start()
    started = time.perf_counter()
    try:
        if processes > 1:
            attempts = _hammer_in_processes(
                url, models, prompts, clients, seconds, max_tokens, timeout, processes
            )
        else:
            attempts = _hammer(url, models, prompts, clients, seconds, max_tokens, timeout)
    finally:
        stop.set()
        sampler.join()
    wall = time.perf_counter() - started
    drained = seconds_to_zero({"inflight": lambda: gateway_inflight(url)}, 0.1)["inflight"]
    report = {"clients": clients, "processes": processes, "seconds": seconds}
    report["wall_s"] = round(wall, 3)
    report |= summarize_overload(attempts)
    report["inflight_after_s"] = drained
    report["kv_reserved_tokens_before"] = kv_before
    report["kv_reserved_tokens_max"] = max(kv_seen, default=None)
    report["kv_reserved_tokens_after"] = replica_kv_reserved(url)
    return report


# -- disconnect: streams cut abruptly after a few tokens


def cut_stream(
    url: str,
    model: str,
    prompt: str,
    max_tokens: int,
    after: int,
    ready: threading.Event,
    go: threading.Event,
    timeout: float = 600.0,
) -> bool:
    """Read `after` content chunks, set `ready`, wait for `go`, then shut the socket down hard.

    True when the stream was cut after `after` chunks (not refused, failed or finished early).
    """
    conn = _connect(url, timeout)
    sock = None
    try:
        _post_chat(conn, model, prompt, max_tokens, None)
        sock = conn.sock  # getresponse() may drop conn.sock when the server closes after
        resp = conn.getresponse()
        seen = 0
        if resp.status == 200:
            for raw in resp:
                chunk = _event(raw)
                if isinstance(chunk, dict) and _has_content(chunk):
                    seen += 1
                if seen >= after or chunk == "DONE":
                    break
        if seen < after:
            return False
        ready.set()
        go.wait(timeout)
        sock.shutdown(socket.SHUT_RDWR)
        return True
    except (OSError, http.client.HTTPException, json.JSONDecodeError):
        return False
    finally:
        ready.set()
        if sock is not None:
            sock.close()
        conn.close()


def run_disconnect(
    url: str,
    models: list[str],
    prompts: list[str],
    streams: int,
    after: int,
    max_tokens: int,
    timeout: float = 600.0,
    poll_s: float = 0.05,
    limit_s: float = 30.0,
) -> dict:
    """The `disconnect` report: `streams` opened at once, cut together after `after` chunks."""
    go, readies, cut = threading.Event(), [threading.Event() for _ in range(streams)], []

    def stream(i: int) -> None:
        model, prompt = models[i % len(models)], prompts[i % len(prompts)]
        cut.append(cut_stream(url, model, prompt, max_tokens, after, readies[i], go, timeout))

    threads = [threading.Thread(target=stream, args=(i,)) for i in range(streams)]
    for t in threads:
        t.start()
    deadline = time.perf_counter() + timeout
    for ready in readies:
        ready.wait(max(0.0, deadline - time.perf_counter()))
    active_before = replica_active(url)
    go.set()
    cut_at = time.perf_counter()
    for t in threads:
        t.join()
    probes = {"inflight": lambda: gateway_inflight(url), "active": lambda: replica_active(url)}
    zero = seconds_to_zero(probes, poll_s, limit_s, started=cut_at)
    return {
        "streams": streams,
        "after_tokens": after,
        "cut": sum(cut),
        "seconds_to_zero_inflight": zero["inflight"],
        "seconds_to_zero_active": zero["active"],
        "active_before_cut": active_before,
    }


# -- plot


def plot(report: dict, path) -> None:
    """A small PNG: throughput and ITL p50 against concurrency (log2), one line per mode."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

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
