"""Each bad adapter is refused with its own error before anything loads."""

from __future__ import annotations

import json
import os
import shutil
import struct

import pytest

from specserve.adapters import errors
from specserve.adapters.settings import AdapterLimits
from specserve.adapters.validate import BaseModelSpec, validate_adapter

BASE = "tiny-llama"


@pytest.fixture
def base(tiny_llama):
    return tiny_llama(0)


@pytest.fixture
def spec(base):
    return BaseModelSpec.of(base, [BASE, "org/Tiny-Llama"])


@pytest.fixture
def limits(adapter_root):
    return AdapterLimits(root=adapter_root, max_rank=16, max_bytes=2**20)


@pytest.fixture
def good(make_adapter, base):
    return make_adapter("good", base)


def _edit_config(path, **changes):
    cfg_path = path / "adapter_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg.update(changes)
    cfg_path.write_text(json.dumps(cfg))


def test_good_adapter_passes_with_its_facts(good, spec, limits):
    checked = validate_adapter(good, spec, limits)
    assert checked.path == good.resolve()
    assert checked.rank == 4
    assert checked.target_modules == ("down_proj", "q_proj", "v_proj")
    assert checked.weights == (good / "adapter_model.safetensors").read_bytes()
    assert len(checked.sha256) == 64


def test_relative_path_resolves_under_root(good, spec, limits):
    assert validate_adapter("good", spec, limits).path == good.resolve()


def test_alias_of_base_name_is_accepted(good, spec, limits):
    _edit_config(good, base_model_name_or_path="org/Tiny-Llama")
    validate_adapter(good, spec, limits)


@pytest.mark.parametrize("suffix", [".bin", ".pt", ".pth", ".pkl", ".ckpt"])
def test_pickle_file_refused(good, spec, limits, suffix):
    (good / f"adapter_model{suffix}").write_bytes(b"\x80\x04cos\nsystem\n")
    with pytest.raises(errors.PickleFormatError, match="pickle"):
        validate_adapter(good, spec, limits)


def test_pickle_only_adapter_refused_as_pickle(good, spec, limits):
    (good / "adapter_model.safetensors").rename(good / "adapter_model.bin")
    with pytest.raises(errors.PickleFormatError):
        validate_adapter(good, spec, limits)


def test_dotdot_refused(good, spec, limits):
    with pytest.raises(errors.AdapterPathError, match=r"'\.\.'"):
        validate_adapter(limits.root / "good" / ".." / "good", spec, limits)


def test_absolute_path_elsewhere_refused(good, spec, limits, tmp_path):
    outside = tmp_path / "elsewhere"
    shutil.copytree(good, outside)
    with pytest.raises(errors.AdapterPathError, match="outside the adapter root"):
        validate_adapter(outside, spec, limits)


def test_symlinked_directory_out_of_root_refused(good, spec, limits, tmp_path):
    outside = tmp_path / "elsewhere"
    shutil.copytree(good, outside)
    os.symlink(outside, limits.root / "sneaky")
    with pytest.raises(errors.AdapterPathError, match="outside the adapter root"):
        validate_adapter("sneaky", spec, limits)


def test_symlinked_file_out_of_root_refused(good, spec, limits, tmp_path):
    secret = tmp_path / "secret.safetensors"
    (good / "adapter_model.safetensors").rename(secret)
    os.symlink(secret, good / "adapter_model.safetensors")
    with pytest.raises(errors.AdapterPathError, match="links outside"):
        validate_adapter(good, spec, limits)


def test_not_a_directory_refused(good, spec, limits):
    with pytest.raises(errors.AdapterPathError, match="not a directory"):
        validate_adapter(good / "adapter_config.json", spec, limits)


@pytest.mark.parametrize("name", ["adapter_config.json", "adapter_model.safetensors"])
def test_missing_file_refused(good, spec, limits, name):
    (good / name).unlink()
    with pytest.raises(errors.MissingAdapterFileError, match=name):
        validate_adapter(good, spec, limits)


def test_rank_above_limit_refused(make_adapter, base, spec, limits):
    path = make_adapter("big", base, rank=32)
    with pytest.raises(errors.RankLimitError, match="32"):
        validate_adapter(path, spec, limits)


def test_rank_hidden_in_tensors_refused(make_adapter, base, spec, limits):
    path = make_adapter("liar", base, rank=32)
    _edit_config(path, r=4)  # the config lies; the tensor shapes do not
    with pytest.raises(errors.RankLimitError, match="tensors have rank 32"):
        validate_adapter(path, spec, limits)


def test_weights_over_size_limit_refused(good, spec, adapter_root):
    small = AdapterLimits(root=adapter_root, max_bytes=1000)
    with pytest.raises(errors.SizeLimitError, match="limit is 1000"):
        validate_adapter(good, spec, small)


def test_other_base_name_refused(good, spec, limits):
    _edit_config(good, base_model_name_or_path="meta-llama/Llama-3-8B")
    with pytest.raises(errors.BaseModelMismatchError, match="Llama-3-8B"):
        validate_adapter(good, spec, limits)


def test_other_base_shapes_refused(make_adapter, tiny_llama, spec, limits):
    wider = tiny_llama(0, hidden=128)  # same names, other shapes
    path = make_adapter("wide", wider)
    with pytest.raises(errors.BaseModelMismatchError, match="shape"):
        validate_adapter(path, spec, limits)


def test_other_base_depth_refused(make_adapter, tiny_llama, spec, limits):
    deeper = tiny_llama(0, layers=3)  # layer 2 does not exist in the served base
    path = make_adapter("deep", deeper)
    with pytest.raises(errors.BaseModelMismatchError, match="no Linear"):
        validate_adapter(path, spec, limits)


def test_missing_target_module_refused(good, spec, limits):
    _edit_config(good, target_modules=["q_proj", "v_proj", "down_proj", "c_attn"])
    with pytest.raises(errors.TargetModuleError, match="c_attn"):
        validate_adapter(good, spec, limits)


def test_regex_target_matching_nothing_refused(good, spec, limits):
    _edit_config(good, target_modules=r".*\.wqkv")
    with pytest.raises(errors.TargetModuleError, match="regex"):
        validate_adapter(good, spec, limits)


def test_corrupt_config_refused(good, spec, limits):
    (good / "adapter_config.json").write_text("{not json")
    with pytest.raises(errors.CorruptAdapterError, match="JSON"):
        validate_adapter(good, spec, limits)


def test_truncated_weights_refused(good, spec, limits):
    path = good / "adapter_model.safetensors"
    path.write_bytes(path.read_bytes()[:-10])
    with pytest.raises(errors.CorruptAdapterError, match="outside the file"):
        validate_adapter(good, spec, limits)


def test_garbage_weights_refused(good, spec, limits):
    (good / "adapter_model.safetensors").write_bytes(struct.pack("<Q", 10**9) + b"xx")
    with pytest.raises(errors.CorruptAdapterError, match="header claims"):
        validate_adapter(good, spec, limits)


def test_dora_refused(good, spec, limits):
    _edit_config(good, use_dora=True)
    with pytest.raises(errors.UnsupportedAdapterError, match="use_dora"):
        validate_adapter(good, spec, limits)


def test_other_peft_type_refused(good, spec, limits):
    _edit_config(good, peft_type="PREFIX_TUNING")
    with pytest.raises(errors.UnsupportedAdapterError, match="PREFIX_TUNING"):
        validate_adapter(good, spec, limits)


def test_every_refusal_has_its_own_code():
    classes = [
        c
        for c in vars(errors).values()
        if isinstance(c, type) and issubclass(c, errors.AdapterError)
    ]
    codes = [c.code for c in classes]
    assert len(classes) >= 10 and len(set(codes)) == len(codes)


@pytest.mark.parametrize(
    ("family", "own", "foreign"),
    [
        ("phi3", ("qkv_proj", "gate_up_proj"), ("q_proj", "v_proj")),
        ("gpt_neox", ("query_key_value", "dense_4h_to_h"), ("q_proj",)),
        ("gemma2", ("q_proj", "down_proj"), ("qkv_proj",)),
    ],
)
def test_targets_are_checked_against_the_familys_own_module_names(
    family, own, foreign, make_adapter, limits
):
    """An adapter on the family's real (fused) projections passes; one trained for another
    layout is refused with the names the base has."""
    from conftest import make_tiny_family

    base = make_tiny_family(family)
    spec = BaseModelSpec.of(base, [BASE])
    checked = validate_adapter(make_adapter("own", base, targets=own), spec, limits)
    assert checked.target_modules == tuple(sorted(own))
    foreign_dir = make_adapter("foreign", base, targets=own)
    _edit_config(foreign_dir, target_modules=list(foreign))
    with pytest.raises(errors.TargetModuleError, match=f"{foreign[0]}.*{own[0]}"):
        validate_adapter(foreign_dir, spec, limits)
