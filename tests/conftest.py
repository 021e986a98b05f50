"""Shared fixtures: tiny seeded random Llama models, a tokenizer stand-in and an Engine factory.

Everything runs on CPU in fp32 with one intra-op thread: the models are so small that thread
hand-offs cost more than the math, and one thread keeps results bit-for-bit reproducible.
"""

from __future__ import annotations

import copy
import functools
import json
from pathlib import Path

import peft
import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from specserve.engine.decode.engine import Engine

torch.set_num_threads(1)


@functools.cache
def _tiny_llama(
    seed: int,
    vocab: int,
    hidden: int,
    layers: int,
    init_range: float,
    head_scale: float,
) -> LlamaForCausalLM:
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        initializer_range=init_range,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).to(torch.float32).eval()
    if head_scale != 1.0:
        with torch.no_grad():
            model.lm_head.weight.mul_(head_scale)
    for p in model.parameters():
        p.requires_grad_(False)
    return model


def make_tiny_llama(
    seed: int = 0,
    vocab: int = 96,
    hidden: int = 64,
    layers: int = 2,
    init_range: float = 0.02,
    head_scale: float = 1.0,
) -> LlamaForCausalLM:
    """A tiny random LlamaForCausalLM (fp32, eval), cached per argument set (treat as read-only)."""
    return _tiny_llama(seed, vocab, hidden, layers, init_range, head_scale)


# --- tiny random models of other architectures (THE GATE of tests/engine/test_families.py) ---

WINDOW = 8  # sliding window of the windowed families: shorter than the prompts + generations


def _family_config(family: str):
    import transformers as tf

    common = {
        "vocab_size": 96,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 512,
        "bos_token_id": None,
        "eos_token_id": None,
        "pad_token_id": None,
        "tie_word_embeddings": False,
    }
    hybrid = {
        "head_dim": 16,
        "sliding_window": WINDOW,
        "layer_types": ["sliding_attention", "full_attention"],
    }
    neox = {k: v for k, v in common.items() if k not in ("num_key_value_heads", "pad_token_id")}
    configs = {
        "llama": lambda: tf.LlamaConfig(**common),
        "qwen2": lambda: tf.Qwen2Config(**common),
        "qwen3": lambda: tf.Qwen3Config(**common, head_dim=16),
        "mistral": lambda: tf.MistralConfig(**common, sliding_window=WINDOW),
        "gemma2": lambda: tf.Gemma2Config(**common, **hybrid),  # soft-capping on by default
        "gemma3": lambda: tf.Gemma3TextConfig(**common, **hybrid),
        "phi3": lambda: tf.Phi3Config(**common, sliding_window=WINDOW),  # as Phi-3 mini (2047)
        "olmo2": lambda: tf.Olmo2Config(**common),
        "gpt_neox": lambda: tf.GPTNeoXConfig(**neox),
    }
    return configs[family]()


FAMILIES = ("llama", "qwen2", "qwen3", "mistral", "gemma2", "gemma3", "phi3", "olmo2", "gpt_neox")


@functools.cache
def _tiny_family(family: str, seed: int):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(_family_config(family)).to(torch.float32).eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model


def make_tiny_family(family: str, seed: int = 0):
    """A tiny random causal LM of `family` (one of FAMILIES; fp32, eval), cached per argument
    set (treat as read-only). The windowed ones (mistral, phi3; gemma2 and gemma3 every other
    layer) have window WINDOW."""
    return _tiny_family(family, seed)


class CharTokenizer:
    """Tokenizer stand-in: id i decodes to one letter chr(97 + i % 26), or to "t{i} " words."""

    def __init__(self, words: bool = False) -> None:
        self.words = words

    def piece(self, i: int) -> str:
        return f"t{i} " if self.words else chr(97 + i % 26)

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return "".join(self.piece(int(i)) for i in ids)


@pytest.fixture(scope="session")
def tiny_llama():
    """Factory: tiny_llama(seed=0, vocab=96, hidden=64, ...) -> cached LlamaForCausalLM."""
    return make_tiny_llama


@pytest.fixture(scope="session")
def model(tiny_llama):
    return tiny_llama(0)


@pytest.fixture(scope="session")
def tokenizer():
    return CharTokenizer()


@pytest.fixture(scope="session")
def word_tokenizer():
    return CharTokenizer(words=True)


@pytest.fixture(scope="session")
def make_engine(tokenizer):
    """Factory: make_engine(model, eos_ids=(), tokenizer=None) -> Engine."""

    def _make(model, eos_ids=(), tok=None) -> Engine:
        return Engine(model, tok or tokenizer, frozenset(eos_ids))

    return _make


def _tiny_tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = ["<unk>", "<s>", "</s>"]
    vocab = {t: i for i, t in enumerate(specials + [f"w{i}" for i in range(61)])}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )


def _save_tiny_model_dir(path: Path) -> Path:
    """A tiny random Llama + WordLevel tokenizer saved as a Hugging Face directory."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        bos_token_id=1,
        eos_token_id=2,
    )
    torch.manual_seed(0)
    LlamaForCausalLM(cfg).save_pretrained(str(path))
    _tiny_tokenizer().save_pretrained(str(path))
    return path


@pytest.fixture(scope="session")
def save_tiny_model_dir():
    """Factory: save_tiny_model_dir(path) -> path holding a loadable tiny HF model dir."""
    return _save_tiny_model_dir


# --- LoRA adapters: real peft adapter directories for the tiny models ---

BASE_NAME = "tiny-llama"


def make_adapter_dir(
    root: Path,
    name: str,
    base,
    seed: int = 0,
    rank: int = 4,
    targets: tuple[str, ...] = ("q_proj", "v_proj", "down_proj"),
    scale: float = 1.0,
    base_name: str = BASE_NAME,
) -> Path:
    """Save a random non-zero LoRA adapter for `base` (a copy is wrapped; `base` is untouched)."""
    config = peft.LoraConfig(
        r=rank, lora_alpha=2 * rank, target_modules=list(targets), init_lora_weights=False
    )
    torch.manual_seed(seed)
    wrapped = peft.get_peft_model(copy.deepcopy(base), config)
    with torch.no_grad():
        for n, p in wrapped.named_parameters():
            if "lora_" in n:
                p.copy_(torch.randn_like(p) * 0.3 * scale)
    out = root / name
    wrapped.save_pretrained(out)
    cfg_path = out / "adapter_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["base_model_name_or_path"] = base_name
    cfg_path.write_text(json.dumps(cfg, indent=2))
    return out


def merged_copy(base, adapter_dir: Path):
    """A plain model with the adapter's weights merged in (the reference an adapter must match)."""
    model = peft.PeftModel.from_pretrained(copy.deepcopy(base), adapter_dir)
    return model.merge_and_unload().eval()


@pytest.fixture
def adapter_root(tmp_path) -> Path:
    root = tmp_path / "adapters"
    root.mkdir()
    return root


@pytest.fixture
def make_adapter(adapter_root):
    """Factory: make_adapter(name, base, seed=0, rank=4, targets=..., scale=1.0, base_name=...)."""
    return lambda name, base, **kw: make_adapter_dir(adapter_root, name, base, **kw)


@pytest.fixture(scope="session")
def merge_adapter():
    """Factory: merge_adapter(base, adapter_dir) -> plain model with the adapter merged."""
    return merged_copy


def _random_drafter(model, spec, seed: int = 0, scale: float = 0.05, vocab=None, acc=None):
    """A drafter with randomly initialized weights for `model` (acceptance low, never trained)."""
    from specserve.engine.drafters.artifact import Drafter, Manifest, build_module

    torch.manual_seed(seed)
    module = build_module(model, spec)
    with torch.no_grad():
        for p in module.parameters():
            p.normal_(0, scale)
    module.eval()
    for p in module.parameters():
        p.requires_grad_(False)
    vocab_ids = vocab if vocab is not None else torch.arange(model.config.vocab_size)
    manifest = Manifest(
        kind=spec.kind,
        base_model_id="tiny",
        base_weights_sha256="0" * 64,
        adapter_sha256=None,
        spec=spec.model_dump(),
        draft_vocab_size=len(vocab_ids),
        accept_rates=acc or [[0.5, 0.3, 0.2, 0.1]] * 4,
    )
    return Drafter(manifest, spec, module, vocab_ids, model)


@pytest.fixture(scope="session")
def random_drafter():
    """Factory: random_drafter(model, spec, seed=0, scale=0.05, vocab=None, acc=None) -> Drafter."""
    return _random_drafter


@pytest.fixture(scope="session")
def tiny_hf_tokenizer():
    """A WordLevel Hugging Face tokenizer over "w0".."w60" (ids 3..63; 0-2 are specials)."""
    return _tiny_tokenizer()
