"""KV memory of sliding-window layers over a long generation, alone and in a Scheduler batch.

Tiny random Mistral (every layer windowed) and Gemma 3 (5 windowed layers : 1 full, as the real
model) configs with a 64-token window; prints per layer type the positions held and the KV bytes
at a few points of a greedy `prompt_lookup` generation, and whether the batch decoded what each
request decodes alone. Usage: python scripts/window_memory.py [--tokens 1000]
"""

from __future__ import annotations

import argparse
import random

import torch
import transformers as tf

from specserve.engine import hf_internals
from specserve.engine.batch.scheduler import Scheduler
from specserve.engine.batch.settings import BatchSettings
from specserve.engine.decode.engine import Engine
from specserve.engine.sampling import SamplingParams

WINDOW = 64


class _Tokens:
    def decode(self, ids, skip_special_tokens=True):
        return " ".join(map(str, ids))


def _model(family: str):
    common = {
        "vocab_size": 256,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 4096,
        "sliding_window": WINDOW,
        "tie_word_embeddings": False,
    }
    if family == "mistral":
        config = tf.MistralConfig(**common, num_hidden_layers=6)
    else:
        kinds = ["sliding_attention"] * 5 + ["full_attention"]
        config = tf.Gemma3TextConfig(**common, head_dim=16, num_hidden_layers=6, layer_types=kinds)
    torch.manual_seed(0)
    return tf.AutoModelForCausalLM.from_config(config).eval()


def alone(model, prompt: list[int], tokens: int) -> None:
    engine = Engine(model, _Tokens(), frozenset())
    state = engine.start(prompt, SamplingParams(max_new_tokens=tokens), "prompt_lookup")
    windows = hf_internals.layer_windows(model.config)
    marks = {len(prompt) + n for n in (64, 256, tokens // 2, tokens)}
    print("  alone: length | window layers: positions, KV bytes | full layers: positions, bytes")
    for _ in engine.stream(state):
        length = hf_internals.cache_length(state.cache)
        if not marks or length < min(marks):
            continue
        marks = {m for m in marks if m > length}
        win = [i for i, w in enumerate(windows) if w]
        full = [i for i, w in enumerate(windows) if not w]
        held_win = state.cache.layers[win[0]].held()
        held_full = state.cache.layers[full[0]].get_seq_length() if full else 0
        win_bytes = hf_internals.kv_bytes(state.cache, win)
        full_bytes = hf_internals.kv_bytes(state.cache, full)
        print(f"  {length:6d} | {held_win:4d}, {win_bytes:8d} | {held_full:5d}, {full_bytes:8d}")


def batched(model, prompts: list[list[int]], tokens: int) -> None:
    engine = Engine(model, _Tokens(), frozenset())
    scheduler = Scheduler(engine, BatchSettings(max_batch=len(prompts)))
    outs = {i: [] for i in range(len(prompts))}
    for i, ids in enumerate(prompts):
        state = engine.start(ids, SamplingParams(max_new_tokens=tokens), "prompt_lookup")
        scheduler.submit(state, "t", True, lambda r, done, i=i: r and outs[i].extend(r.new_ids))
    peak = {}
    while scheduler.active():
        scheduler.step()
        for g in scheduler.kv.groups:
            kind = "full" if g.window is None else "window"
            size = hf_internals.kv_bytes(scheduler.kv.cache, g.layers)
            peak[kind] = max(peak.get(kind, (0, 0)), (g.columns, size))
    exact = all(
        outs[i]
        == Engine(model, _Tokens(), frozenset())
        .generate(ids, SamplingParams(max_new_tokens=tokens), "prompt_lookup")
        .output_ids
        for i, ids in enumerate(prompts)
    )
    for kind, (columns, size) in sorted(peak.items()):
        print(f"  batch of {len(prompts)}: {kind} layers peak {columns} columns, {size} KV bytes")
    print(f"  batch outputs equal each request alone: {exact}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, default=1000)
    args = parser.parse_args()
    torch.set_num_threads(1)
    rng = random.Random(0)
    prompts = [[rng.randrange(256) for _ in range(n)] for n in (40, 90, 150, 20)]
    for family in ("mistral", "gemma3"):
        model = _model(family)
        print(f"{family} (window {WINDOW}, layers {hf_internals.layer_windows(model.config)})")
        alone(model, prompts[0], args.tokens)
        batched(model, prompts, args.tokens // 2)


if __name__ == "__main__":
    main()
