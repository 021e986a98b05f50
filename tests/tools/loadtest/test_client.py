"""Tests for specserve.tools.loadtest.client: what request i is, tickets across threads."""

import threading

from specserve.tools.loadtest.client import Tickets, Traffic, run_all


def test_traffic_cycles_models_and_prompts_and_rotates_prompts():
    traffic = Traffic(url="http://h:1", models=["a", "b"], prompts=["p", "q", "r"], max_tokens=4)
    asked = [(traffic.request(i).model, traffic.request(i).prompt) for i in range(4)]
    assert asked == [("a", "p"), ("b", "q"), ("a", "r"), ("b", "p")]
    assert traffic.request(0, prompt=2).prompt == "r" and traffic.request(0).max_tokens == 4
    assert traffic.rotated(1).prompts == ["q", "r", "p"] and traffic.prompts == ["p", "q", "r"]


def test_tickets_hand_out_each_number_once_up_to_the_limit():
    tickets, taken, lock = Tickets(limit=500), [], threading.Lock()

    def take(_: int) -> None:
        while (i := tickets.take()) is not None:
            with lock:
                taken.append(i)

    run_all(take, 8)
    assert sorted(taken) == list(range(500)) and tickets.take() is None
    unbounded = Tickets()
    assert [unbounded.take() for _ in range(3)] == [0, 1, 2]
