"""Drafter artifacts: `drafter.safetensors` + `manifest.json` in one directory.

`save_drafter` writes both; `load_drafter` checks the manifest against the served model (base
model id and weights hash, adapter fingerprint) and refuses a mismatch with `DrafterMismatchError`
naming what differs, so a drafter never silently drafts garbage for another model. The manifest's
spec must be its kind's (`drafters.specs`); the module comes from that kind's `DRAFTER_KINDS` entry.
"""

from __future__ import annotations

import datetime
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

import torch
from pydantic import BaseModel, ConfigDict, Field, model_validator
from safetensors.torch import load_file, save_file
from torch import nn

from specserve.engine.drafters.kinds import DRAFTER_KINDS
from specserve.engine.drafters.specs import DrafterSpec, KindName

FORMAT_VERSION = 1
MANIFEST = "manifest.json"
WEIGHTS = "drafter.safetensors"


class DrafterMismatchError(ValueError):
    """The drafter was trained for another model or adapter than the one served."""


class Manifest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    format_version: int = FORMAT_VERSION
    kind: KindName
    base_model_id: str
    base_weights_sha256: str
    adapter_sha256: str | None
    spec: DrafterSpec
    draft_vocab_size: int
    accept_rates: list[list[float]] = Field(
        description="held-out acc[d][r]: rank-r candidate at depth d + 1 is the target's token"
    )
    heldout_tau: float | None = None  # measured by decoding held-out prompts with the drafter
    # dtype of the target whose features it learned (None: written before this was recorded)
    feature_dtype: str | None = None
    training: dict = Field(default_factory=dict)  # data description, sizes, time, steps
    created_at: str = Field(default_factory=lambda: datetime.datetime.now(datetime.UTC).isoformat())

    @model_validator(mode="after")
    def _spec_of_its_kind(self) -> Manifest:
        if self.spec.kind != self.kind:
            raise ValueError(f"manifest of kind {self.kind!r} holds a {self.spec.kind!r} spec")
        return self


@dataclass
class Drafter:
    """A drafter bound to the target it was checked against."""

    manifest: Manifest
    spec: DrafterSpec
    module: nn.Module  # the kind's module (`DRAFTER_KINDS.get(kind).build_module`)
    draft_vocab: torch.Tensor  # [v] token ids the draft LM head scores
    target: object  # the served model (frozen embedding, LM head and rotary come from it)
    notes: list[str] = field(default_factory=list)  # served, but not as trained (e.g. the dtype)

    @property
    def kind(self) -> str:
        return self.manifest.kind


def _base_param_name(name: str) -> str | None:
    """Parameter name in the plain base model, or None for adapter (LoRA) weights."""
    if "lora_" in name or "modules_to_save" in name:
        return None
    for prefix in ("base_model.model.",):
        name = name.removeprefix(prefix)
    return name.replace(".base_layer.", ".")


@torch.no_grad()
def base_weights_sha256(model) -> str:
    """sha256 over (name, shape, bf16-rounded bytes) of every base parameter, adapter weights
    excluded: the same for the model in fp32 or bf16, and for it wrapped by peft."""
    digest = hashlib.sha256()
    named = {}
    for name, param in model.named_parameters():
        base = _base_param_name(name)
        if base is not None:
            named[base] = param
    for name in sorted(named):
        t = named[name].detach().to("cpu", torch.bfloat16).contiguous()
        digest.update(f"{name}\0{tuple(t.shape)}\0".encode())
        digest.update(t.view(torch.int16).numpy().tobytes())
    return digest.hexdigest()


def build_module(model, spec: DrafterSpec) -> nn.Module:
    """The untrained module of `spec`'s kind for `model`, in the model's dtype."""
    return DRAFTER_KINDS.get(spec.kind).build_module(model, spec).to(model.dtype)


def save_drafter(out_dir: Path, manifest: Manifest, module, draft_vocab: torch.Tensor) -> Path:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().to("cpu").contiguous() for k, v in module.state_dict().items()}
    tensors["draft_vocab"] = draft_vocab.to("cpu", torch.long).contiguous()
    save_file(tensors, str(out_dir / WEIGHTS))
    (out_dir / MANIFEST).write_text(manifest.model_dump_json(indent=1))
    return out_dir


def read_manifest(path: Path) -> Manifest:
    path = Path(path)
    file = path / MANIFEST if path.is_dir() else path
    if not file.exists():
        raise FileNotFoundError(f"drafter: no {MANIFEST} in {path}")
    return Manifest.model_validate(json.loads(file.read_text()))


def check_manifest(
    manifest: Manifest, model_id: str, weights_sha256: str, adapter_sha256: str | None
) -> None:
    """Raise DrafterMismatchError naming every field that does not match the served model."""
    problems = []
    if manifest.base_weights_sha256 != weights_sha256:
        problems.append(
            f"base model weights differ (drafter trained on {manifest.base_model_id!r} with "
            f"weights sha256 {manifest.base_weights_sha256[:12]}..., served {model_id!r} has "
            f"{weights_sha256[:12]}...)"
        )
    if manifest.adapter_sha256 != adapter_sha256:
        problems.append(
            f"adapter differs (drafter trained with adapter "
            f"{manifest.adapter_sha256 or 'none (base model)'}, served with "
            f"{adapter_sha256 or 'none (base model)'})"
        )
    if problems:
        raise DrafterMismatchError(
            f"drafter ({manifest.kind}) does not match the served model: " + "; ".join(problems)
        )


def load_drafter(
    path: Path,
    model,
    model_id: str,
    adapter_sha256: str | None = None,
    weights_sha256: str | None = None,
) -> Drafter:
    """Load a drafter for `model` (plain or peft-wrapped base + adapter) after checking its
    manifest; `weights_sha256` may be passed when already computed for this model."""
    manifest = read_manifest(path)
    if manifest.format_version != FORMAT_VERSION:
        raise ValueError(
            f"drafter {path}: format_version {manifest.format_version}, expected {FORMAT_VERSION}"
        )
    check_manifest(manifest, model_id, weights_sha256 or base_weights_sha256(model), adapter_sha256)
    module = build_module(model, manifest.spec)
    tensors = load_file(str(Path(path) / WEIGHTS))
    vocab = tensors.pop("draft_vocab")
    module.load_state_dict(tensors)
    module.to(model.device).eval()
    for p in module.parameters():
        p.requires_grad_(False)
    return Drafter(
        manifest,
        manifest.spec,
        module,
        vocab.to(model.device),
        model,
        dtype_notes(manifest, model),
    )


def dtype_notes(manifest: Manifest, model) -> list[str]:
    """A note when the drafter learned features of another dtype than the one it serves in
    (bf16 features differ from fp32 ones enough to lower acceptance; the output stays lossless).

    Example: trained on torch.float32 features, served on bfloat16 -> ["eagle drafter trained on
    torch.float32 features, served on torch.bfloat16: acceptance may be lower than measured"].
    """
    trained = manifest.feature_dtype or manifest.training.get("dtype")
    served = str(model.dtype)
    if trained is None or trained == served:
        return []
    note = (
        f"{manifest.kind} drafter trained on {trained} features, served on {served}: "
        "acceptance may be lower than measured; retrain in the serving dtype"
    )
    return [note]
