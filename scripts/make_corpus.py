"""Write the instruction corpus `train-drafter` learns from without generating:
specserve/training/corpus/instruct.jsonl.gz, one {"prompt", "answer"} per line.

Prompts: `training_prompts(count, seed=1)` (synthesized from built-in topic lists and Python's
bundled docs, never benchmark data). Answers: a model's greedy answers (batched `generate()`, the
serving dtype), generated once here so that every later training is teacher-forced prefill only.
Resumable (progress in --work); deterministic for the same model, dtype and machine kind.
`--extend`: the prompts already in --out keep their answers; only the new ones are generated.

    .venv/bin/python scripts/make_corpus.py --model smollm2-135m --dtype bfloat16
    .venv/bin/python scripts/make_corpus.py --prompts 3200 --dtype float32 --extend
"""

from __future__ import annotations

import argparse
import gzip
import json
import time
from pathlib import Path

from specserve.engine.prompts import encode_prompt
from specserve.models.load import load_model
from specserve.paths import default_cache_dir
from specserve.training.data import DistillData, generate_answers
from specserve.training.prompts import SOURCE, training_prompts

OUT = (
    Path(__file__).resolve().parents[1] / "specserve" / "training" / "corpus" / "instruct.jsonl.gz"
)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--prompts", type=int, default=1600)
    ap.add_argument("--max-new-tokens", type=int, default=160)
    ap.add_argument("--batch", type=int, default=48)
    ap.add_argument("--minutes", type=float, default=40.0, help="stop (resumable) after this")
    ap.add_argument("--work", type=Path, default=default_cache_dir() / "corpus-work")
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--extend", action="store_true", help="keep the answers already in --out")
    args = ap.parse_args()
    known = existing_answers(args.out) if args.extend else {}
    loaded = load_model(args.model, dtype=args.dtype)
    tok = loaded.tokenizer
    args.work.mkdir(parents=True, exist_ok=True)
    kept = f"-extends-{len(known)}" if known else ""
    work = args.work / f"{args.model}-{args.dtype}-{args.prompts}-{args.max_new_tokens}{kept}.pt"
    every = training_prompts(args.prompts, seed=1)
    corpus_rows(every, known, {})  # fails before any generation if --prompts would drop rows
    texts = [t for t in every if t not in known]
    if work.exists():
        data = DistillData.load(work)
    else:
        data = DistillData(
            prompts=[encode_prompt(tok, t) for t in texts],
            answers=[None] * len(texts),
            max_new_tokens=args.max_new_tokens,
            source=SOURCE,
        )
    started = time.monotonic()

    def progress(n: int) -> None:
        done = len(data.done)
        print(f"{done}/{len(texts)} answers, {time.monotonic() - started:.0f}s", flush=True)

    deadline = started + args.minutes * 60
    generate_answers(loaded.model, data, loaded.eos_token_ids, args.batch, work, deadline, progress)
    new = {texts[i]: tok.decode(data.answers[i], skip_special_tokens=True) for i in data.done}
    rows = corpus_rows(every, known, new)
    write_rows(args.out, rows)
    print(f"wrote {len(rows)} of {len(every)} examples to {args.out} ({len(known)} kept)")
    return 0 if len(rows) == len(every) else 3


def corpus_rows(prompts: list[str], known: dict[str, str], new: dict[str, str]) -> list[dict]:
    """One row per answered prompt, in `prompts`' order; a kept answer wins over a new one, and
    a kept prompt missing from `prompts` (--prompts below the file's count) is an error, never a
    dropped row.

    Example: (["a", "b", "c"], {"b": "B"}, {"a": "A"}) -> [{"prompt": "a", "answer": "A"},
    {"prompt": "b", "answer": "B"}] ("c" is not answered yet).
    """
    asked = set(prompts)
    lost = [t for t in known if t not in asked]
    if lost:
        raise ValueError(f"{len(lost)} prompts of the corpus file are not among --prompts")
    answered = {**new, **known}
    return [{"prompt": t, "answer": answered[t]} for t in prompts if t in answered]


def write_rows(path: Path, rows: list[dict]) -> None:
    """The corpus file, replaced whole (written to a side file first)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".part")
    with gzip.open(tmp, "wt", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    tmp.replace(path)


def existing_answers(path: Path) -> dict[str, str]:
    """prompt -> answer of every row already in a corpus file (none if it does not exist)."""
    if not path.exists():
        return {}
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return {r["prompt"]: r["answer"] for r in map(json.loads, f)}


if __name__ == "__main__":
    raise SystemExit(main())
