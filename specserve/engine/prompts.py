"""Prompt encoding (chat template or raw text) and calibration prompts that never come from a
benchmark: they are built from the documentation bundled with Python (`pydoc_data.topics`)."""

from __future__ import annotations

from pydoc_data.topics import topics


def encode_chat(tokenizer, messages: list[dict[str, str]]) -> list[int]:
    """Token ids of `messages` under the tokenizer's chat template, ready for the assistant turn."""
    if not messages or not any(m.get("content") for m in messages):
        raise ValueError("prompt: must not be empty")
    ids = tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True, return_dict=False
    )
    return list(ids)


def encode_messages(tokenizer, messages: list[dict[str, str]]) -> list[int]:
    """A conversation as ids for the next assistant turn: the chat template when the tokenizer has
    one, else the contents joined by newlines (a base model without a template)."""
    if getattr(tokenizer, "chat_template", None):
        return encode_chat(tokenizer, messages)
    text = "\n".join(m["content"] for m in messages) + "\n"
    ids = list(tokenizer(text, add_special_tokens=False)["input_ids"])
    if not ids:
        raise ValueError("prompt: must not be empty")
    return ids


def encode_prompt(tokenizer, prompt: str, chat: bool = True) -> list[int]:
    """A user prompt as token ids, through the chat template when the tokenizer has one."""
    if not prompt:
        raise ValueError("prompt: must not be empty")
    if chat and getattr(tokenizer, "chat_template", None):
        return encode_chat(tokenizer, [{"role": "user", "content": prompt}])
    return list(tokenizer(prompt, add_special_tokens=False)["input_ids"])


def calibration_prompts(count: int = 4, chars: int = 700) -> list[str]:
    """Prompts for tuning draft parameters: summarize / explain passages of Python's own docs.

    Deterministic: the same topics in the same order every time.
    """
    names = sorted(topics)[:: max(len(topics) // (2 * count), 1)]
    tasks = [
        "Summarize the following documentation in a few sentences:\n\n{text}",
        "Explain the following passage to a beginner, with an example:\n\n{text}",
    ]
    return [
        tasks[i % len(tasks)].format(text=topics[name][:chars].strip())
        for i, name in enumerate(names[:count])
    ]
