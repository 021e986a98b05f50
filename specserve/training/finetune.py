"""Train a small LoRA adapter (peft) on a text or JSONL file, within a time budget, CPU or CUDA.

`load_examples(path, tokenizer, ...)` turns the file into token ids with loss labels;
`finetune(model, tokenizer, examples, config, out_dir, base_name)` trains and writes a peft
adapter directory (safetensors) plus `specserve-finetune.json` describing the run.
"""

from __future__ import annotations

import json
import math
import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import peft
import torch
from pydantic import BaseModel, ConfigDict, Field
from tqdm import tqdm

from specserve.engine import families
from specserve.engine.prompts import encode_messages

IGNORE = -100  # label of tokens that carry no loss (prompt, padding)
RECORD_FILE = "specserve-finetune.json"
JSONL_SHAPES = '{"text": ...}, {"prompt": ..., "completion": ...} or {"messages": [...]}'


class FinetuneConfig(BaseModel):
    """LoRA and optimizer settings; unknown names fail."""

    model_config = ConfigDict(extra="forbid")

    rank: int = Field(8, gt=0)
    alpha: float = Field(16.0, gt=0)
    dropout: float = Field(0.05, ge=0, lt=1)
    # None: the model family's attention projections (`families.Family.lora_targets`)
    target_modules: list[str] | None = None
    learning_rate: float = Field(1e-3, gt=0)
    batch_size: int = Field(4, gt=0)
    block_size: int = Field(256, gt=8)
    epochs: int = Field(3, gt=0)
    budget_minutes: float = Field(10.0, gt=0)
    held_out_fraction: float = Field(0.1, ge=0, lt=1)
    seed: int = 0


@dataclass(frozen=True)
class Example:
    ids: list[int]
    labels: list[int]  # IGNORE where no loss


def _completion_example(
    tokenizer, messages: list[dict], answer: str, eos_id: int, block: int
) -> Example:
    prompt = encode_messages(tokenizer, messages)
    answer_ids = list(tokenizer(answer, add_special_tokens=False)["input_ids"]) + [eos_id]
    ids = (prompt + answer_ids)[:block]
    labels = ([IGNORE] * len(prompt) + answer_ids)[:block]
    return Example(ids, labels)


def _text_examples(tokenizer, text: str, block: int) -> list[Example]:
    ids = list(tokenizer(text, add_special_tokens=False)["input_ids"])
    return [Example(ids[i : i + block], ids[i : i + block]) for i in range(0, len(ids) - 1, block)]


def load_examples(path: Path, tokenizer, eos_id: int, block_size: int = 256) -> list[Example]:
    """A .txt file is cut into blocks (loss everywhere); a .jsonl file holds one of JSONL_SHAPES per
    line (loss on the answer only: the completion, or the last assistant message)."""
    path = Path(path)
    if path.suffix == ".txt":
        return _text_examples(tokenizer, path.read_text(), block_size)
    if path.suffix != ".jsonl":
        raise ValueError(f"data: {path.name} must be a .txt or .jsonl file")
    examples: list[Example] = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            raise ValueError(f"data: {path.name} line {n} is not JSON: {err}") from None
        if isinstance(row, dict) and set(row) == {"text"}:
            examples += _text_examples(tokenizer, row["text"], block_size)
        elif isinstance(row, dict) and set(row) == {"prompt", "completion"}:
            user = [{"role": "user", "content": row["prompt"]}]
            examples.append(
                _completion_example(tokenizer, user, row["completion"], eos_id, block_size)
            )
        elif (
            isinstance(row, dict)
            and set(row) == {"messages"}
            and row["messages"][-1].get("role") == "assistant"
        ):
            *context, last = row["messages"]
            examples.append(
                _completion_example(tokenizer, context, last["content"], eos_id, block_size)
            )
        else:
            raise ValueError(
                f"data: {path.name} line {n}: expected {JSONL_SHAPES} (messages ending with assistant)"
            )
    if not examples:
        raise ValueError(f"data: {path.name} holds no examples")
    return examples


def collate(batch: list[Example], pad_id: int, device) -> dict[str, torch.Tensor]:
    """Right-pad to the longest row. Example: ids [[5, 6], [7]] -> [[5, 6], [7, pad]], mask [[1, 1], [1, 0]]."""
    width = max(len(e.ids) for e in batch)
    ids = torch.full((len(batch), width), pad_id, dtype=torch.long)  # [batch, width]
    labels = torch.full((len(batch), width), IGNORE, dtype=torch.long)
    mask = torch.zeros((len(batch), width), dtype=torch.long)
    for r, e in enumerate(batch):
        ids[r, : len(e.ids)] = torch.tensor(e.ids)
        labels[r, : len(e.labels)] = torch.tensor(e.labels)
        mask[r, : len(e.ids)] = 1
    return {
        "input_ids": ids.to(device),
        "labels": labels.to(device),
        "attention_mask": mask.to(device),
    }


def lr_at(peak: float, step: int, steps: int) -> float:
    """Linear warm-up over 10 steps, then linear decay to 5 % of `peak` at `steps`.

    Example: peak 1e-3, 100 steps: step 0 -> 1e-4, step 9 -> 9.1e-4, step 99 -> 5e-5.
    """
    return peak * min(1.0, (step + 1) / 10) * max(1.0 - step / steps, 0.05)


@torch.no_grad()
def mean_loss(model, examples: list[Example], config: FinetuneConfig, pad_id: int) -> float:
    """Token-weighted mean loss over `examples` (the held-out set)."""
    total, count = 0.0, 0
    for i in range(0, len(examples), config.batch_size):
        batch = collate(examples[i : i + config.batch_size], pad_id, model.device)
        tokens = int((batch["labels"][:, 1:] != IGNORE).sum())
        total += float(model(**batch).loss) * tokens
        count += tokens
    return total / max(count, 1)


def finetune(
    model,
    tokenizer,
    examples: list[Example],
    config: FinetuneConfig,
    out_dir: Path,
    base_name: str,
    data_desc: dict,
) -> dict:
    """Wrap `model` (in place) with a fresh LoRA adapter, train it, save it; returns the run record."""
    rng = random.Random(config.seed)
    examples = list(examples)
    rng.shuffle(examples)
    n_held = math.floor(len(examples) * config.held_out_fraction)
    held, train = examples[:n_held], examples[n_held:]
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    torch.manual_seed(config.seed)
    base_dtype = str(model.dtype)
    model = _with_lora(model, config)  # LoRA weights in float32 (peft's default upcast)
    loss_before = mean_loss(model.eval(), held, config, pad_id) if held else None
    fit = _fit(model, train, config, pad_id, rng)
    model.eval()
    loss_after = mean_loss(model, held, config, pad_id) if held else None
    model.peft_config["default"].base_model_name_or_path = base_name
    model.save_pretrained(out_dir, safe_serialization=True, save_embedding_layers=False)
    losses = fit.losses
    record = {
        "base_model": base_name,
        "data": data_desc,
        "config": config.model_dump(),
        "examples": {"train": len(train), "held_out": len(held)},
        "steps": fit.steps,
        "dtype": base_dtype,  # the frozen base's; the trained LoRA weights are float32
        "adapter_dtype": str(next(p for p in model.parameters() if p.requires_grad).dtype),
        "stopped_by": fit.stopped_by,
        "seconds": round(time.monotonic() - fit.started, 1),
        "train_loss_first_last": [round(losses[0], 4), round(losses[-1], 4)] if losses else None,
        "held_out_loss_before_after": [loss_before, loss_after],
    }
    (Path(out_dir) / RECORD_FILE).write_text(json.dumps(record, indent=1))
    return record


def _with_lora(model, config: FinetuneConfig):
    """`model` wrapped by peft with a fresh LoRA adapter of `config`'s shape."""
    lora = peft.LoraConfig(
        r=config.rank,
        lora_alpha=config.alpha,
        lora_dropout=config.dropout,
        target_modules=config.target_modules or list(families.family_of(model.config).lora_targets),
        task_type="CAUSAL_LM",
    )
    return peft.get_peft_model(model, lora)


@dataclass
class _Fit:
    """How a fine-tune's training went: when it started, its steps and their losses, and whether
    it ran all epochs or stopped at the time budget."""

    started: float
    steps: int = 0
    losses: list[float] = field(default_factory=list)
    stopped_by: str = "epochs"


def _fit(model, train: list[Example], config: FinetuneConfig, pad_id: int, rng) -> _Fit:
    """Train `model`'s trainable weights over `train` for the epochs or until the budget ends."""
    optimizer = torch.optim.AdamW(
        [p for p in model.parameters() if p.requires_grad], lr=config.learning_rate
    )
    total_steps = math.ceil(len(train) / config.batch_size) * config.epochs
    deadline = time.monotonic() + 60 * config.budget_minutes
    fit = _Fit(started=time.monotonic())
    schedule_steps = total_steps
    model.train()
    with tqdm(total=total_steps, desc="finetune", unit="step", file=sys.stderr) as bar:
        for _epoch in range(config.epochs):
            rng.shuffle(train)
            for i in range(0, len(train), config.batch_size):
                if time.monotonic() > deadline:
                    fit.stopped_by = "budget"
                    break
                step = fit.steps
                if step == 5:  # fix the schedule's length once: all steps, or what the budget fits
                    fits = int((deadline - fit.started) / ((time.monotonic() - fit.started) / step))
                    schedule_steps = max(min(total_steps, fits), step + 1)
                for group in optimizer.param_groups:
                    group["lr"] = lr_at(config.learning_rate, step, schedule_steps)
                loss = model(**collate(train[i : i + config.batch_size], pad_id, model.device)).loss
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                fit.losses.append(loss.item())
                fit.steps += 1
                bar.update(1)
                bar.set_postfix(loss=f"{fit.losses[-1]:.3f}")
            if fit.stopped_by == "budget":
                break
    return fit
