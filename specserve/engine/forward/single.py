"""One forward of the unmodified target over [pending tokens | draft tree | aux branch].

Public Hugging Face API only: the cache argument, `position_ids`, a 4D additive attention mask and
`logits_to_keep` (laid out by `inputs`), so logits are computed just for the rows the verifier and
proposer read. The call goes to the model's compiled forward when one is attached and warm
(`compiled`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specserve.engine import hf_internals, row_tiles
from specserve.engine.forward import compiled
from specserve.engine.forward.inputs import attention_masks, build_inputs, invariant_kwargs
from specserve.engine.lora.batch import lora_rows
from specserve.engine.tree import Draft
from specserve.engine.verify import greedy_tokens


@dataclass(frozen=True)
class ForwardOutput:
    tree_logits: torch.Tensor  # [n + 1, vocab]: root (last pending token), then each draft node
    aux_tokens: list[int]  # target argmax at the aux branch's logit rows
    # [p + n, layers, hidden]: the requested hidden features of the pending rows, then of each
    # draft node (row p - 1 is the root); None when no layers were requested
    features: torch.Tensor | None = None


@torch.inference_mode()
def verify_forward(
    model,
    cache,
    past: int,
    pending: list[int],
    draft: Draft,
    pad_to: int = 0,
    feature_layers: tuple[int, ...] = (),
    adapter: str | None = None,
    aligned: int = 0,
) -> ForwardOutput:
    """Run the target (with LoRA `adapter`, None = base) once; the cache grows by
    max(len(pending) + len(tree) + len(aux), pad_to). `aligned`: the first pending rows that
    are prompt tokens in whole aligned tiles (`row_tiles.aligned_rows`; row-tiled models).

    `feature_layers` (see `hf_internals.hidden_features`) asks for the hidden features of the
    pending and tree rows, which feature-level drafters (Medusa, EAGLE) draft from.
    """
    inputs = build_inputs(past, pending, draft, pad_to)
    device = model.device
    mask = None  # a single query row sees everything: the model's own (causal) path is exact
    if inputs.input_ids.shape[1] > 1:
        offset = hf_internals.window_offset(cache)
        mask = attention_masks(model.config, inputs, past, offset, model.dtype, device)
    invariant = invariant_kwargs(model, inputs.allowed[None], inputs.position_ids)
    forward = (  # the model or its compiled one
        model if invariant else compiled.runner(model, inputs.input_ids.shape[1], past)
    )
    rows = inputs.input_ids.shape[1]
    with lora_rows(model, [adapter]), row_tiles.aligned_prompt(model, rows, aligned, past):
        out = forward(
            input_ids=inputs.input_ids.to(device),
            position_ids=inputs.position_ids.to(device),
            attention_mask=mask,
            **hf_internals.cache_kwargs(model, cache),
            use_cache=True,
            logits_to_keep=inputs.logit_rows.to(device),
            **({"output_hidden_states": True} if feature_layers else {}),
            **invariant,
        )
    logits = out.logits[0]  # [r, vocab]
    n = len(draft.tree)
    aux_tokens = greedy_tokens(logits[n + 1 :]) if draft.aux else []
    features = None
    if feature_layers:
        rows = len(pending) + n
        features = hf_internals.hidden_features(out, feature_layers)[0, :rows]  # [p + n, L, H]
    return ForwardOutput(tree_logits=logits[: n + 1], aux_tokens=aux_tokens, features=features)
