"""`specserve loadtest`: drive a running server with concurrent streaming chat requests spread over
variants, per concurrency level and mode (`ar` forced, `spec` = lookahead forced, `policy`), and
report throughput, TTFT and inter-token latency percentiles, τ and failures as JSON."""

from __future__ import annotations

import http.client
import json
import statistics
import threading
import time
import urllib.parse
from dataclasses import dataclass, field

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


def percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile. Example: [1, 2, 3, 4] at 0.5 -> 2; at 0.99 -> 4."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, min(len(ordered), int(-(-q * len(ordered) // 1))))
    return ordered[rank - 1]


def stream_chat(
    url: str,
    model: str,
    prompt: str,
    max_tokens: int,
    timeout: float = 600.0,
    token: str | None = None,
) -> Sample:
    """One streaming chat request; times the first content chunk and the rest."""
    parts = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port or 80, timeout=timeout)
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
    started = time.perf_counter()
    try:
        conn.request("POST", "/v1/chat/completions", json.dumps(body), headers)
        resp = conn.getresponse()
        if resp.status != 200:
            return Sample(False, error=f"HTTP {resp.status}: {resp.read()[:200]!r}")
        first = last = None
        tokens, tau = 0, None
        for raw in resp:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
            if chunk.get("specserve"):
                tau = chunk["specserve"].get("tau")
            if any(c.get("delta", {}).get("content") for c in chunk.get("choices", [])):
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
) -> Level:
    """`requests` requests with `concurrency` in flight, round-robin over models and prompts."""
    level, lock, next_i = Level(), threading.Lock(), [0]

    def worker() -> None:
        while True:
            with lock:
                i = next_i[0]
                if i >= requests:
                    return
                next_i[0] += 1
            sample = stream_chat(
                url, models[i % len(models)], prompts[i % len(prompts)], max_tokens
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
