"""Random batch schedules shared by the continuous-batching gates (tests/engine/batch/test_scheduler.py,
test_families.py): requests over strategies and adapters that join, leave and get cancelled at
random steps, run through a Scheduler, and the same requests decoded alone; models holding
random adapters for them."""

from __future__ import annotations

import copy
import random

import torch
from peft import LoraConfig, get_peft_model

from specserve.engine.decode.engine import Engine
from specserve.engine.lora.batch import BASE_ADAPTER
from specserve.engine.lora.store import attach_store
from specserve.engine.sampling import SamplingParams

ADAPTERS = ["v1", "v2", "v3"]
STRATEGIES = {
    "ar": None,
    "prompt_lookup": None,
    "lookahead": {"window": 3, "ngram": 3, "guesses": 2},
    "medusa": {"tree_size": 6},
    "eagle": {"depth": 3, "topk": 2, "total_tokens": 6},
    "hybrid": {"budget": 8, "eagle": {"depth": 3, "topk": 2, "total_tokens": 1}},
}


def with_adapters(base, names: list[str], targets=("q_proj", "v_proj", "down_proj"), peft=False):
    """A copy of `base` holding rank-4 adapters `names` on `targets`, each with seeded random B
    (so each changes the output); frozen, eval. By default the adapters sit in the copy's
    LoRAStore (the serving path); `peft=True` returns the peft wrapper they were made in."""
    config = LoraConfig(r=4, lora_alpha=8, target_modules=list(targets))
    model = get_peft_model(copy.deepcopy(base), config, adapter_name=names[0])
    for name in names[1:]:
        model.add_adapter(name, config)
    torch.manual_seed(7)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.2)
    model.requires_grad_(False)
    if peft:
        return model.eval()
    plain = copy.deepcopy(base).eval()
    store = attach_store(plain)
    for name in names:
        store.add(name, peft_tensors(model, name))
    return plain


def peft_tensors(peft_model, name: str) -> dict:
    """{module name in the base: (A, B x scaling)} of adapter `name`, read from peft's layers."""
    out = {}
    for module_name, m in peft_model.base_model.model.named_modules():
        if hasattr(m, "lora_A") and name in m.lora_A:
            a = m.lora_A[name].weight.detach().clone()
            out[module_name] = a, m.lora_B[name].weight.detach() * m.scaling[name]
    return out


def prompt(rng: random.Random, n: int) -> list[int]:
    motif = [rng.randrange(96) for _ in range(rng.randint(3, 7))]
    return [motif[i % len(motif)] if rng.random() < 0.8 else rng.randrange(96) for i in range(n)]


def requests(seed: int, count: int, adapters: list[str] = ADAPTERS) -> list[dict]:
    rng = random.Random(seed)
    out = []
    for i in range(count):
        strategy = rng.choice(list(STRATEGIES))
        out.append(
            {
                "prompt": prompt(rng, rng.choice([1, 5, 17, 40, 70])),
                "strategy": strategy,
                "adapter": rng.choice(adapters + [BASE_ADAPTER]),
                "max_new": rng.randint(4, 24),
                "join_at": rng.randint(0, 25),
                "cancel_at": rng.randint(3, 30) if rng.random() < 0.15 else None,
                "tenant": f"t{i % 3}",
                "temperature": 0.0 if rng.random() < 0.75 else 0.9,
                "seed": rng.randrange(1000),
            }
        )
    return out


def sampling(req: dict) -> SamplingParams:
    return SamplingParams(
        max_new_tokens=req["max_new"], temperature=req["temperature"], seed=req["seed"]
    )


def alone(engine: Engine, req: dict) -> list[int]:
    params = sampling(req)
    state = engine.start(
        req["prompt"], params, req["strategy"], STRATEGIES[req["strategy"]], None, req["adapter"]
    )
    for _ in engine.stream(state):
        pass
    return state.output_ids


def run(engine, scheduler, reqs, sink_log=None, admit=None) -> dict[int, dict]:
    """Submit each request at its join step, cancel at its cancel step; step until all done.
    `admit(req)`: called at the join step; returns a callable run when the request finishes, or
    None to retry at the next step (an adapter server making the request's adapter resident)."""
    seen: dict[int, dict] = {i: {"ids": [], "finished": False} for i in range(len(reqs))}
    seen[-1] = {"max_rows": 0, "finished": True, "adapters": set()}
    tickets = {}
    join_at = {i: req["join_at"] for i, req in enumerate(reqs)}
    release = {}
    step = 0
    while not all(s["finished"] for s in seen.values()):
        for i, req in enumerate(reqs):
            if join_at[i] == step and admit is not None:
                release[i] = admit(req)
                if release[i] is None:
                    join_at[i] += 1
                    continue
            if join_at[i] == step:
                params = sampling(req)
                state = engine.start(
                    req["prompt"],
                    params,
                    req["strategy"],
                    STRATEGIES[req["strategy"]],
                    None,
                    req["adapter"],
                )

                def sink(result, finished, i=i):
                    if result is not None:
                        seen[i]["ids"].extend(result.new_ids)
                    if finished and not seen[i]["finished"] and release.get(i):
                        release.pop(i)()
                    seen[i]["finished"] = seen[i]["finished"] or finished

                tickets[i] = scheduler.submit(state, req["tenant"], True, sink)
            if req["cancel_at"] == step and i in tickets:
                scheduler.cancel(tickets[i])
                seen[i]["cancelled"] = True
        scheduler.step()
        rows = [t.state.adapter for t in scheduler.decoding]
        seen[-1]["max_rows"] = max(seen[-1]["max_rows"], len(rows))
        seen[-1]["adapters"] = seen[-1]["adapters"] | ({*rows} if len(rows) > 1 else set())
        seen[-1].setdefault("caps", set()).add(scheduler.last_cap)
        assert scheduler.reserved <= scheduler.settings.kv_tokens
        step += 1
        assert step < 2000, "the scheduler stopped making progress"
    return seen
