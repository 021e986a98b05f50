"""The `overload` report: more clients than capacity, back to back for a while; how many requests
were admitted, completed, refused (503/429: how fast, with Retry-After?) or failed, how long the
gateway's in-flight count took to drain, and the KV positions reserved meanwhile."""

from __future__ import annotations

import concurrent.futures
import multiprocessing
import random
import threading
import time
from typing import Literal

from pydantic.dataclasses import dataclass

from specserve.platform.api.http_client import REQUEST_ERRORS, ChatRequest, open_chat
from specserve.tools.loadtest.client import Tickets, Traffic, run_all
from specserve.tools.loadtest.probes import gateway_inflight, replica_kv_reserved, seconds_to_zero
from specserve.tools.loadtest.stats import rounded, spread

GATEWAY_FULL = b"is at capacity"  # the gateway's own refusal, before any model server


@dataclass
class Attempt:
    """One request of an overload run, classified (it crosses from client processes)."""

    status: Literal["completed", "refused", "failed"]  # refused: 503/429
    admitted: bool = False  # got HTTP 200
    refused_s: float | None = None  # send -> status line, for refusals
    retry_after: bool = False
    retry_after_s: float = 0.0  # the header's value (0 when absent or not a number)
    error: str = ""
    refused_by: Literal["", "gateway", "replica"] = ""


def attempt_chat(request: ChatRequest) -> Attempt:
    """One streaming request, classified: completed only with the final `[DONE]`."""
    status = None
    started = time.perf_counter()
    try:
        with open_chat(request) as stream:
            status = stream.status
            if status in (429, 503):
                seconds = time.perf_counter() - started
                header = stream.headers.get("Retry-After") or ""
                wait = float(header) if header.replace(".", "", 1).isdigit() else 0.0
                by = "gateway" if GATEWAY_FULL in stream.read()[:4096] else "replica"
                return Attempt(
                    "refused",
                    refused_s=seconds,
                    retry_after=bool(header),
                    retry_after_s=wait,
                    refused_by=by,
                )
            if status != 200:
                return Attempt("failed", error=f"HTTP {status}")
            done = any(event == "DONE" for event in stream.events())
            return Attempt(
                "completed" if done else "failed", True, error="" if done else "no [DONE]"
            )
    except REQUEST_ERRORS as err:
        admitted = status == 200
        return Attempt("failed", admitted, error=f"{type(err).__name__}: {err}")


def summarize_overload(attempts: list[Attempt]) -> dict:
    """Counts, refusal latency percentiles and the share of refusals carrying Retry-After."""
    refused = [a for a in attempts if a.status == "refused"]
    latencies = [a.refused_s for a in refused if a.refused_s is not None]
    overall = spread(latencies)
    by_whom = {}
    for by in sorted({a.refused_by for a in refused if a.refused_by}):
        mine = [a.refused_s for a in refused if a.refused_by == by]
        if mine:
            figures = spread(mine)
            by_whom[by] = {
                "count": len(mine),
                "latency_p50_s": figures["p50"],
                "latency_p99_s": figures["p99"],
            }
    return {
        "admitted": sum(a.admitted for a in attempts),
        "completed": sum(a.status == "completed" for a in attempts),
        "refused": len(refused),
        "failed": sum(a.status == "failed" for a in attempts),
        "refused_latency_p50_s": overall["p50"],
        "refused_latency_p99_s": overall["p99"],
        "refused_latency_max_s": rounded(max(latencies, default=None)),
        "retry_after_present": (
            round(sum(a.retry_after for a in refused) / len(refused), 4) if refused else None
        ),
        "refused_by": by_whom,
    }


def _sample_kv(url: str, stop: threading.Event, poll_s: float, seen: list[float]) -> None:
    """Every `poll_s` until `stop`: append the replicas' largest reserved KV positions."""
    while not stop.wait(poll_s):
        value = replica_kv_reserved(url)
        if value is not None:
            seen.append(value)


def _hammer(traffic: Traffic, clients: int, seconds: float, ramp_s: float = 1.0) -> list[Attempt]:
    """`clients` threads sending back to back until `seconds` pass; every attempt made. Clients
    start evenly over the first `ramp_s`, at most a quarter of the window (a ramp-up: started all
    at once, the first refusals wait behind every admission of the same instant). After a
    refusal a client waits its Retry-After plus up to half as much again (jitter, as
    well-behaved clients do)."""
    attempts: list[Attempt] = []
    tickets = Tickets()
    start = time.perf_counter()
    deadline = start + seconds
    ramp_s = min(ramp_s, seconds / 4)  # every client gets most of the window

    def client(seed: int) -> None:
        jitter = random.Random(seed)
        time.sleep(max(0.0, start + ramp_s * seed / clients - time.perf_counter()))
        while time.perf_counter() < deadline:
            attempt = attempt_chat(traffic.request(tickets.take()))
            attempts.append(attempt)
            if attempt.status == "refused":  # a well-behaved client honours Retry-After
                wait = attempt.retry_after_s * (1.0 + 0.5 * jitter.random())
                time.sleep(max(0.0, min(wait, deadline - time.perf_counter())))

    run_all(client, clients)
    return attempts


def _hammer_in_processes(
    traffic: Traffic, clients: int, seconds: float, processes: int
) -> list[Attempt]:
    """`_hammer` split over `processes` processes (each its share of the clients and its own
    rotation of the prompts), so one interpreter's lock does not delay the replies it times."""
    shares = [clients // processes + (i < clients % processes) for i in range(processes)]
    jobs = [(traffic.rotated(i), share, seconds) for i, share in enumerate(shares) if share]
    spawn = multiprocessing.get_context("spawn")  # no fork of a process holding threads
    with concurrent.futures.ProcessPoolExecutor(len(jobs), mp_context=spawn) as pool:
        return [a for part in pool.map(_hammer, *zip(*jobs, strict=True)) for a in part]


def run_overload(
    traffic: Traffic,
    clients: int,
    seconds: float,
    kv_poll_s: float = 1.0,
    processes: int = 1,
) -> dict:
    """The `overload` report: `clients` back-to-back streams of `traffic` for `seconds` (from
    `processes` client processes), then the drain of its server."""
    url = traffic.url
    kv_before = replica_kv_reserved(url)
    stop, kv_seen = threading.Event(), []
    sampler = threading.Thread(target=_sample_kv, args=(url, stop, kv_poll_s, kv_seen))
    sampler.start()
    started = time.perf_counter()
    try:
        if processes > 1:
            attempts = _hammer_in_processes(traffic, clients, seconds, processes)
        else:
            attempts = _hammer(traffic, clients, seconds)
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
