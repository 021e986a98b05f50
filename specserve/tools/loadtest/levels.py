"""Load levels: `run_level` keeps `concurrency` streaming requests in flight until `requests` are
done; `summarize` turns its samples into throughput, TTFT / inter-token latency percentiles, τ and
failures. `interleave_tasks` and `level_requests` give every level the same Spec-Bench task mix."""

from __future__ import annotations

import statistics
import time
from dataclasses import field

from pydantic.dataclasses import dataclass

from specserve.platform.api.http_client import (
    REQUEST_ERRORS,
    ChatRequest,
    ChatStream,
    has_content,
    open_chat,
)
from specserve.tools.loadtest.client import Tickets, Traffic, run_all
from specserve.tools.loadtest.stats import rounded, spread

MODES = {
    "ar": "ar",
    "spec": "lookahead",
    "policy": None,
}  # mode -> strategy forced on every variant


@dataclass
class Sample:
    """One streaming request as the client saw it."""

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


def _timed(stream: ChatStream, started: float) -> Sample:
    """Read a 200 stream to its end, timing the first content chunk and the rest."""
    first = last = None
    tokens, tau = 0, None
    for chunk in stream.events():
        if not isinstance(chunk, dict):
            continue
        if chunk.get("usage"):
            tokens = chunk["usage"]["completion_tokens"]
        if chunk.get("specserve"):
            tau = chunk["specserve"].get("tau")
        if has_content(chunk):
            last = time.perf_counter()
            first = first or last
    ttft = (first - started) if first else None
    itl = (last - first) / (tokens - 1) if first and tokens > 1 else None
    return Sample(True, tokens, ttft, itl, tau)


def stream_chat(request: ChatRequest) -> Sample:
    """One streaming chat request; times the first content chunk and the rest."""
    started = time.perf_counter()
    try:
        with open_chat(request) as stream:
            if stream.status != 200:
                return Sample(False, error=f"HTTP {stream.status}: {stream.read()[:200]!r}")
            return _timed(stream, started)
    except REQUEST_ERRORS as err:
        return Sample(False, error=f"{type(err).__name__}: {err}")


def run_level(traffic: Traffic, concurrency: int, requests: int, first_prompt: int = 0) -> Level:
    """`requests` of `traffic` with `concurrency` in flight, round-robin over its models, taking
    prompts from `first_prompt` on (so levels of a run need not repeat prompts)."""
    level, tickets = Level(), Tickets(limit=requests)

    def worker(_: int) -> None:
        while (i := tickets.take()) is not None:
            level.samples.append(stream_chat(traffic.request(i, prompt=first_prompt + i)))

    started = time.perf_counter()
    run_all(worker, concurrency)
    level.seconds = time.perf_counter() - started
    return level


def summarize(level: Level) -> dict:
    """A level's report: throughput, TTFT and ITL p50/p99, mean τ, failed requests."""
    ok = [s for s in level.samples if s.ok]
    tokens = sum(s.tokens for s in ok)
    ttft = spread([s.ttft for s in ok if s.ttft is not None])
    itl = spread([s.itl for s in ok if s.itl is not None])
    taus = [s.tau for s in ok if s.tau]
    return {
        "throughput_tok_s": round(tokens / level.seconds, 2) if level.seconds else 0.0,
        "ttft_p50_s": ttft["p50"],
        "ttft_p99_s": ttft["p99"],
        "itl_p50_s": itl["p50"],
        "itl_p99_s": itl["p99"],
        "tau": rounded(statistics.mean(taus), 3) if taus else None,
        "failed": len(level.samples) - len(ok),
    }
