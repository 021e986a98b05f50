"""One request, one output, tried as a user would: through the official openai SDK against a
running `specserve up`, 5 identical seeded requests (temperature 0.7, seed 42) and 3 greedy ones,
then the same again while 8 other streams decode. Prints JSON (distinct outputs per group).

    python scripts/one_output.py --base-url http://127.0.0.1:8000/v1 --model smollm2-135m
"""

from __future__ import annotations

import argparse
import json
import threading

from openai import OpenAI

QUESTION = "Write three sentences about the history of the printing press."
OTHERS = [
    "List five uses of a paperclip.",
    "Explain what a binary search does.",
    "Summarize the plot of Romeo and Juliet in two sentences.",
    "What is the capital of Australia, and why was it chosen?",
]


def _ask(client: OpenAI, model: str, max_tokens: int, **sampling) -> tuple[str, dict]:
    reply = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": QUESTION}],
        max_tokens=max_tokens,
        **sampling,
    )
    extra = reply.model_extra or {}
    info = extra.get("specserve", {})
    return reply.choices[0].message.content, info


def _group(client, model, max_tokens) -> dict:
    seeded = [_ask(client, model, max_tokens, temperature=0.7, seed=42) for _ in range(5)]
    greedy = [_ask(client, model, max_tokens, temperature=0) for _ in range(3)]
    return {
        "seeded_distinct": len({text for text, _ in seeded}),
        "greedy_distinct": len({text for text, _ in greedy}),
        "strategies": sorted({info.get("strategy", "?") for _, info in seeded + greedy}),
        "invariant": sorted({str(info.get("invariant")) for _, info in seeded + greedy}),
        "seeded": seeded[0][0],
        "greedy": greedy[0][0],
    }


def _stream(client, model, prompt: str, stop: threading.Event) -> None:
    while not stop.is_set():
        for _ in client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": prompt}],
            max_tokens=96,
            temperature=0.8,
            stream=True,
        ):
            if stop.is_set():
                break


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base-url", default="http://127.0.0.1:8000/v1")
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--max-tokens", type=int, default=64)
    args = ap.parse_args()
    client = OpenAI(base_url=args.base_url, api_key="unused", timeout=600)
    quiet = _group(client, args.model, args.max_tokens)
    stop = threading.Event()
    streams = [
        threading.Thread(target=_stream, args=(client, args.model, OTHERS[i % 4], stop))
        for i in range(8)
    ]
    for t in streams:
        t.start()
    try:
        loaded = _group(client, args.model, args.max_tokens)
    finally:
        stop.set()
        for t in streams:
            t.join()
    same = quiet["seeded"] == loaded["seeded"] and quiet["greedy"] == loaded["greedy"]
    print(json.dumps({"alone": quiet, "beside_8_streams": loaded, "same_across": same}, indent=1))


if __name__ == "__main__":
    main()
