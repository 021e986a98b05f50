"""The served LM head: float32 over a bf16 model, the column product, and both lossless."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from specserve.engine import row_tiles
from specserve.engine.decode.engine import Engine
from specserve.engine.drafters.specs import EagleSpec, MedusaSpec
from specserve.engine.forward.compiled import forward_key
from specserve.engine.forward.head import (
    LmHead,
    column_faster,
    column_head,
    head_product,
    install_head,
    product_seconds,
)
from specserve.engine.sampling import SamplingParams


@pytest.mark.parametrize("column", [False, True])
def test_float32_head_matches_a_float64_reference(column):
    head = torch.nn.Linear(8, 5, bias=True).to(torch.bfloat16)
    w32 = torch.nn.Parameter(head.weight.float(), requires_grad=False)
    b32 = torch.nn.Parameter(head.bias.float(), requires_grad=False)
    x = torch.randn(2, 3, 8).to(torch.bfloat16)
    got = LmHead(w32, b32, column)(x)
    ref = x.double() @ head.weight.double().T + head.bias.double()
    assert got.dtype == torch.float32 and got.shape == (2, 3, 5)
    torch.testing.assert_close(got.double(), ref, rtol=1e-6, atol=1e-6)


def test_column_product_is_the_linear_product_and_one_row_is_unchanged():
    weight = torch.nn.Parameter(torch.randn(300, 16), requires_grad=False)
    head = LmHead(weight, None, column=True)
    x = torch.randn(1, 7, 16)
    torch.testing.assert_close(head(x), F.linear(x, weight), rtol=1e-5, atol=1e-5)
    one = torch.randn(1, 1, 16)
    assert torch.equal(head(one), F.linear(one, weight))  # 1 row: F.linear itself
    x, w = torch.tensor([[1.0, 2.0]]), torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    assert head_product(x, w, column=True).tolist() == [[1.0, 2.0, 3.0]]  # the worked example
    assert head_product(x.repeat(3, 1), w, column=True).tolist() == [[1.0, 2.0, 3.0]] * 3


def test_use_float32_head_on_a_bf16_model_only(tiny_llama, tokenizer):
    fp32 = copy.deepcopy(tiny_llama(1, init_range=0.1))
    got = install_head(fp32, float32=True)
    assert got is None or "float32" not in got  # already float32: at most the column product
    model = copy.deepcopy(tiny_llama(1, init_range=0.1)).to(torch.bfloat16)
    assert "in float32" in install_head(model, float32=True)
    assert install_head(model, float32=True) is None  # once
    out = model(input_ids=torch.tensor([[3, 4, 5]]))
    assert out.logits.dtype == torch.float32
    engine = Engine(model, tokenizer, frozenset())
    prompt = [3, 4, 5, 6, 7, 3, 4, 5, 6, 7, 3, 4]
    ar = engine.generate(prompt, SamplingParams(max_new_tokens=16), "ar").output_ids
    assert len(ar) == 16


@pytest.mark.parametrize("strategy", ["prompt_lookup", "lookahead", "hybrid", "eagle", "medusa"])
def test_a_column_head_keeps_every_strategy_equal_to_generate(
    tiny_llama, tokenizer, random_drafter, strategy
):
    model = copy.deepcopy(tiny_llama(1, init_range=0.1))
    head = model.get_output_embeddings()
    column = LmHead(head.weight, head.bias, column=True)
    rows_seen: list[int] = []
    column.register_forward_hook(lambda mod, args, out: rows_seen.append(out.shape[-2]))
    model.set_output_embeddings(column)
    assert column_head(model) and forward_key(model).endswith("+column_head")
    drafters = {  # the drafters' heads take the column product too (`head_product`)
        "medusa": random_drafter(model, MedusaSpec(heads=2, topk=4), seed=2, scale=0.1),
        "eagle": random_drafter(model, EagleSpec(feature_layers=(0, -1)), seed=3, scale=0.1),
    }
    prompt = [5, 6, 7, 8, 5, 6, 7, 8, 5, 6, 7, 9, 10, 5, 6, 7]
    with torch.inference_mode():
        ref = model.generate(
            torch.tensor([prompt]), do_sample=False, max_new_tokens=24, min_new_tokens=24
        )
    rows_seen.clear()  # generate() asked for one logit row a step
    engine = Engine(model, tokenizer, frozenset(), drafters=drafters)  # hybrid: with EAGLE
    got = engine.generate(prompt, SamplingParams(max_new_tokens=24), strategy)
    assert got.output_ids == ref[0, len(prompt) :].tolist()
    assert max(rows_seen) >= 2  # the column product ran (verify rows beyond the root)


def test_row_tiles_replace_the_column_product(tiny_llama):
    model = copy.deepcopy(tiny_llama(0))
    head = model.get_output_embeddings()
    model.set_output_embeddings(LmHead(head.weight, head.bias, column=True))
    row_tiles.tile_linears(model, 8)  # what an invariant model gets: F.linear in row tiles
    assert not column_head(model) and "+column_head" not in forward_key(model)


def test_product_seconds_times_both_products_and_only_cpu_is_measured():
    linear, column = product_seconds(torch.randn(64, 8), rows=(2, 3), repeats=3)
    assert linear > 0 and column > 0
    assert column_faster(torch.empty(64, 8, device="meta")) is False  # not measured off CPU
