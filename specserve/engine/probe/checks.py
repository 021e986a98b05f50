"""The probe's checks on one tiny fp32 model, cheapest first; each returns normally or raises
`CheckFailed` with what it expected and what it got. They decode through the engine exactly as
it serves (its forward, masks, positions and caches) and compare with Hugging Face's own path.
"""

from __future__ import annotations

import copy
import random
from dataclasses import dataclass, field

import torch
from transformers import GenerationConfig

from specserve.engine import hf_internals
from specserve.engine.decode.core import Decoder
from specserve.engine.drafters.artifact import Drafter, Manifest, build_module
from specserve.engine.drafters.modules import EagleSpec, MedusaSpec
from specserve.engine.forward.single import verify_forward
from specserve.engine.lora.store import attach_store
from specserve.engine.probe.projections import Projections, find_projections
from specserve.engine.probe.result import CheckFailure
from specserve.engine.sampling import SamplingParams
from specserve.engine.tree import Draft, DraftTree

MAX_NEW = 16
ADAPTER = "probe"
LOGIT_TOL = 1e-3  # fp32: one forward path against another differs by ~1e-6 on a tiny model
STRATEGIES = {
    "ar": None,
    "prompt_lookup": None,
    "lookahead": {"window": 3, "ngram": 3, "guesses": 2},
    "medusa": {"tree_size": 6},
    "eagle": {"depth": 3, "topk": 2, "total_tokens": 6},
}


class CheckFailed(Exception):
    def __init__(self, failure: CheckFailure) -> None:
        super().__init__(failure.describe())
        self.failure = failure


class IdTokenizer:
    """The engine's tokenizer stand-in: ids decode to "<id> " words."""

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return "".join(f"{int(i)} " for i in ids)


@dataclass
class Probe:
    """What the checks share: the tiny model (holding one resident LoRA adapter once `lora`
    ran), its engine, prompts and the references computed so far."""

    model: object
    prompts: list[list[int]]
    engine: Decoder | None = None
    projections: Projections = field(default_factory=Projections)
    merged: object = None  # the model with the adapter merged into its weights
    lora_checked: tuple[str, ...] = ()  # the projections the LoRA check put the adapter on
    want: dict = field(default_factory=dict)  # (adapter, prompt index) -> greedy generate()


def prompts(vocab: int) -> list[list[int]]:
    """Two repetitive prompts (so prompt lookup and Lookahead draft), longer than the window."""
    rng = random.Random(0)
    out = []
    for n in (14, 30):
        motif = [rng.randrange(3, vocab) for _ in range(rng.randint(3, 7))]
        out.append(
            [
                motif[i % len(motif)] if rng.random() < 0.8 else rng.randrange(3, vocab)
                for i in range(n)
            ]
        )
    return out


def greedy(model, ids: list[int], max_new: int = MAX_NEW) -> list[int]:
    """Hugging Face `generate()`, greedy, no early stop."""
    model.generation_config = GenerationConfig()
    x = torch.tensor([ids])
    out = model.generate(
        x, attention_mask=torch.ones_like(x), max_new_tokens=max_new, do_sample=False
    )
    return out[0, len(ids) :].tolist()


def same_tokens(check: str, want: list[int], got: list[int], detail: str = "") -> None:
    if want == got:
        return
    step = next((i for i, (a, b) in enumerate(zip(want, got)) if a != b), min(len(want), len(got)))
    raise CheckFailed(
        CheckFailure(
            check=check,
            step=step,
            expected=f"tokens {want[step : step + 4]}",
            got=f"tokens {got[step : step + 4]}",
            detail=detail,
        )
    )


def layer_kinds(p: Probe) -> None:
    """The engine serves the architecture's layer kinds and builds its cache."""
    try:
        hf_internals.layer_windows(p.model.config)
        hf_internals.new_cache(p.model.config)
    except (ValueError, TypeError, KeyError) as e:
        raise CheckFailed(CheckFailure(check="layer kinds", detail=str(e))) from e


def projections(p: Probe) -> None:
    """LoRA targets are found in the decoder layers (Linear modules only: the LoRA store's)."""
    p.projections = find_projections(p.model)
    if not p.projections.attention and not p.projections.mlp:
        raise CheckFailed(
            CheckFailure(
                check="projections",
                detail="no Linear attention or MLP projections in the decoder layers",
            )
        )


def drafters(p: Probe) -> None:
    """Medusa and EAGLE build from the architecture's hidden size, head and decoder layer."""
    found = {}
    for seed, spec in ((2, MedusaSpec(heads=2, topk=4)), (3, EagleSpec(feature_layers=(0, -1)))):
        try:
            found[spec.kind] = random_drafter(p.model, spec, seed)
        except Exception as e:
            raise CheckFailed(
                CheckFailure(check=f"{spec.kind} drafter", detail=f"{type(e).__name__}: {e}")
            ) from e
    # a Decoder, not an Engine: the probe itself decides whether the family is admitted
    p.engine = Decoder(p.model, IdTokenizer(), frozenset(), drafters=found)


def random_drafter(model, spec, seed: int) -> Drafter:
    torch.manual_seed(seed)
    module = build_module(model, spec)
    with torch.no_grad():
        for w in module.parameters():
            w.normal_(0, 0.1)
    module.eval().requires_grad_(False)
    vocab = model.config.get_text_config().vocab_size
    manifest = Manifest(
        kind=spec.kind,
        base_model_id="probe",
        base_weights_sha256="0" * 64,
        adapter_sha256=None,
        spec=spec.model_dump(),
        draft_vocab_size=vocab,
        accept_rates=[[0.5, 0.3, 0.2, 0.1]] * 4,
    )
    return Drafter(manifest, spec, module, torch.arange(vocab), model)


def decode(p: Probe, ids: list[int], strategy: str, adapter: str | None = None) -> list[int]:
    params = SamplingParams(max_new_tokens=MAX_NEW, ignore_eos=True)
    return p.engine.generate(
        ids, params, strategy, STRATEGIES[strategy], adapter=adapter
    ).output_ids


def ar_equals_generate(p: Probe) -> None:
    for i, ids in enumerate(p.prompts):
        p.want[None, i] = greedy(p.model, ids)
        same_tokens("ar = generate()", p.want[None, i], decode(p, ids, "ar"), f"prompt {i}")


def tree_verify(p: Probe) -> None:
    """One verify forward over [3 pending | a 6-node tree] after a cached prefill gives, at every
    node, the logits of the model's own forward over that node's whole path."""
    model, ids = p.model, p.prompts[1]
    rng = random.Random(1)
    tok = [rng.randrange(3, model.config.get_text_config().vocab_size) for _ in range(6)]
    tree = DraftTree.from_chains([[tok[0], tok[1], tok[2]], [tok[0], tok[3]], [tok[4], tok[5]]])
    cache = hf_internals.new_cache(model.config)
    verify_forward(model, cache, 0, ids[:-3], Draft())
    out = verify_forward(model, cache, len(ids) - 3, ids[-3:], Draft(tree))
    paths = [[]]
    for i, parent in enumerate(tree.parents):
        paths.append((paths[parent + 1] if parent >= 0 else []) + [tree.tokens[i]])
    with torch.inference_mode():
        for row, path in enumerate(paths):
            want = model(input_ids=torch.tensor([ids + path])).logits[0, -1]
            got = out.tree_logits[row]
            diff = float((want - got).abs().max())
            if diff > LOGIT_TOL * max(1.0, float(want.abs().max())):
                raise CheckFailed(
                    CheckFailure(
                        check="tree verify = sequential",
                        step=row,
                        expected=f"token {int(want.argmax())}",
                        got=f"token {int(got.argmax())}",
                        detail=f"node {row} (0: root) at depth {len(path)}, max |logit diff| "
                        f"{diff:.3g}",
                    )
                )


def strategies_equal_ar(p: Probe) -> None:
    for name in STRATEGIES:
        for i, ids in enumerate(p.prompts):
            same_tokens(f"{name} = ar", p.want[None, i], decode(p, ids, name), f"prompt {i}")


def lora_equals_merged(p: Probe) -> None:
    """A LoRA on every found projection, served from the LoRA store, equals its merged weights
    under every strategy; the base rows stay the base. Where peft turns the MLP names into an
    MoE's fused expert parameters (transformers 5 layouts), which the store does not serve, the
    LoRA is on the attention projections only (`p.lora_checked` says which)."""
    tensors, p.merged = lora_pair(p.model, p.projections.all)
    if tensors is None and p.projections.attention:
        tensors, p.merged = lora_pair(p.model, p.projections.attention)
    if tensors is None:
        raise CheckFailed(
            CheckFailure(
                check="LoRA = merged weights",
                detail="peft puts the LoRA on modules that are not Linear (fused experts)",
            )
        )
    p.lora_checked = tuple(sorted({name.rsplit(".", 1)[-1] for name in tensors}))
    attach_store(p.model).add(ADAPTER, tensors)
    for i, ids in enumerate(p.prompts):
        p.want[ADAPTER, i] = greedy(p.merged, ids)
    for name in STRATEGIES:
        for i, ids in enumerate(p.prompts):
            got = decode(p, ids, name, ADAPTER)
            same_tokens(f"{name} with LoRA = merged", p.want[ADAPTER, i], got, f"prompt {i}")
    same_tokens("base beside LoRA", p.want[None, 1], decode(p, p.prompts[1], "ar"))


def lora_pair(model, targets: tuple[str, ...]):
    """({module: (A, B x scaling)}, merged model) of a seeded rank-4 peft LoRA on `targets`;
    (None, None) when peft also wraps a module that is not a Linear."""
    from peft import LoraConfig, get_peft_model  # lazy: peft adds ~2 s to import

    linears = [  # full names: a leaf name can also be a fused experts module's parameter
        name
        for name, m in model.named_modules()
        if isinstance(m, torch.nn.Linear) and name.rsplit(".", 1)[-1] in targets
    ]
    config = LoraConfig(r=4, lora_alpha=8, target_modules=linears)
    wrapped = get_peft_model(copy.deepcopy(model), config, adapter_name=ADAPTER)
    torch.manual_seed(7)
    with torch.no_grad():
        for name, w in wrapped.named_parameters():
            if "lora_B" in name:
                w.normal_(0, 0.2)
    tensors = {}
    for name, m in wrapped.base_model.model.named_modules():
        if hasattr(m, "lora_A") and not isinstance(m.get_base_layer(), torch.nn.Linear):
            return None, None
        if hasattr(m, "lora_A") and ADAPTER in m.lora_A:
            a = m.lora_A[ADAPTER].weight.detach().clone()
            tensors[name] = a, m.lora_B[ADAPTER].weight.detach().clone() * m.scaling[ADAPTER]
    merged = wrapped.merge_and_unload().eval()
    merged.requires_grad_(False)
    return tensors, merged
