"""The platform on a `LocalCluster`, deployed as `specserve up` deploys it: the application args and
deployment options of specserve/configs/serve.yaml, `build_app`, an embedded Redis on loopback; a
tiny random model (and random LoRA variants) made on disk so replicas start in seconds on a CPU."""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from specserve.paths import config_file
from specserve.platform.rayserve.up import load_serve_config

MODEL = "tiny"
SERVER = f"ModelServer-{MODEL}"
WORDS = 61  # the tiny tokenizer's words: w0 .. w60


class ScalingOverrides(BaseModel):
    """What the demo shortens in the ModelServer's autoscaling_config (None: serve.yaml's)."""

    model_config = ConfigDict(frozen=True)

    upscale_delay_s: float | None = Field(None, ge=0)
    downscale_delay_s: float | None = Field(None, ge=0)


def serve_app_config(
    model_dir: Path, adapter_root: Path, scaling: ScalingOverrides, config: Path | None = None
) -> tuple[dict, list[dict]]:
    """(args, deployments) of the packaged serve.yaml for the tiny model: same options, the
    first model's ModelServer block renamed for it, its delays overridden by `scaling`."""
    args, deployments, _ = load_serve_config(config or config_file("serve.yaml"))
    first = f"ModelServer-{args['models'][0]}"
    args |= {
        "models": [MODEL],
        "model_dirs": {MODEL: str(model_dir)},
        "adapter_root": str(adapter_root),
        "dtype": "float32",  # exact: a prompt's output is the same on every replica
        "compile": "off",
        "torch_threads": 1,
        "max_tokens": 240,
    }
    out = []
    for deployment in deployments:
        deployment = json.loads(json.dumps(deployment))
        if deployment["name"] == first:
            deployment["name"] = SERVER
            auto = deployment["autoscaling_config"]
            auto |= {k: v for k, v in scaling.model_dump().items() if v is not None}
        out.append(deployment)
    return args, out


def server_scaling(deployments: list[dict]) -> dict:
    """The ModelServer's autoscaling_config as deployed."""
    (server,) = [d for d in deployments if d["name"] == SERVER]
    return dict(server["autoscaling_config"])


def make_tiny_model(path: Path) -> Path:
    """A tiny random Llama (2 layers, hidden 32) and a WordLevel tokenizer over w0..w60, saved
    as a Hugging Face directory; seeded, so every run makes the same weights."""
    import tokenizers  # lazy: only the model builders need it; the config helpers skip it
    import torch  # lazy: the config helpers (and their tests) load without torch (about 3 s)
    import transformers  # lazy: the config helpers load without transformers (about 3 s)

    specials = ["<unk>", "<s>", "</s>"]
    vocab = {t: i for i, t in enumerate(specials + [f"w{i}" for i in range(WORDS)])}
    config = transformers.LlamaConfig(
        vocab_size=len(vocab),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        bos_token_id=1,
        eos_token_id=2,
    )
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(config).save_pretrained(str(path))
    backend = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )
    tokenizer.save_pretrained(str(path))
    return path


def make_adapter(model_dir: Path, target: Path, seed: int) -> Path:
    """A random (non-zero) LoRA adapter for the tiny model at `target`, naming it as its base."""
    import peft  # lazy: the config helpers (and their tests) load without peft (about 1 s)
    import torch  # lazy: the config helpers load without torch (about 3 s)
    from transformers import AutoModelForCausalLM  # lazy: the config helpers skip it (about 3 s)

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(str(model_dir))
    config = peft.LoraConfig(
        r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False
    )
    peft.get_peft_model(model, config).save_pretrained(str(target))
    path = target / "adapter_config.json"
    path.write_text(json.dumps(json.loads(path.read_text()) | {"base_model_name_or_path": MODEL}))
    return target


def prompt(seed: int, words: int = 12) -> str:
    """A prompt of the tiny model's words, different per seed."""
    return " ".join(f"w{(seed * 7 + i * (seed % 5 + 3)) % WORDS}" for i in range(words))


def deploy(args: dict, deployments: list[dict], port: int) -> None:
    """serve.start on this machine's loopback (the head's proxy on `port`) and serve.run of the
    application `specserve up` runs, waiting until it is ready."""
    from ray import serve  # lazy: only deploying needs Serve (about 1 s); the helpers skip it

    from specserve.platform.rayserve.deployments import build_app  # lazy: torch (about 3 s)

    serve.start(http_options={"host": "127.0.0.1", "port": port})
    serve.run(build_app(args, deployments), name="specserve", route_prefix="/")
