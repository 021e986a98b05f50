"""Write data/finetune/python-topics.jsonl: prompt/completion pairs from Python's bundled docs.

Source: `pydoc_data.topics` (the reference-manual topics `help()` shows, shipped with CPython,
PSF licence). Each topic gives two examples: "Explain <title>" and "Summarize what the Python
reference says about <title>", answered by the topic's opening paragraphs (<= ~600 characters).
Deterministic; rerun with `python scripts/make_finetune_data.py`.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from pydoc_data.topics import topics

OUT = Path(__file__).resolve().parents[1] / "data" / "finetune" / "python-topics.jsonl"
MAX_CHARS = 600


def title_and_body(text: str) -> tuple[str, str]:
    lines = text.strip().splitlines()
    if len(lines) > 1 and set(lines[1].strip()) <= set("*=-") and lines[1].strip():
        return lines[0].strip(), "\n".join(lines[2:]).strip()
    return "", text.strip()


def opening(body: str) -> str:
    """Whole paragraphs from the start, up to MAX_CHARS (at least one)."""
    paragraphs = [p.strip("\n").rstrip() for p in re.split(r"\n\s*\n", body) if p.strip()]
    kept: list[str] = []
    for p in paragraphs:
        if kept and sum(len(k) for k in kept) + len(p) > MAX_CHARS:
            break
        kept.append(p)
    return "\n\n".join(kept)[: 2 * MAX_CHARS]


def main() -> int:
    rows = []
    for name in sorted(topics):
        title, body = title_and_body(topics[name])
        subject = title[0].lower() + title[1:] if title.startswith("The ") else title
        subject = subject or f"the '{name}' topic"
        answer = opening(body)
        if not answer:
            continue
        rows.append({"prompt": f"Explain {subject} in Python.", "completion": answer})
        rows.append(
            {
                "prompt": f"Summarize what the Python reference says about {subject}.",
                "completion": answer,
            }
        )
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    print(f"wrote {len(rows)} examples to {OUT}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
