"""Why an adapter was refused: one exception class (and stable `code`) per reason.

Every refusal happens before anything is loaded; the platform maps `code` onto its API errors.
"""

from __future__ import annotations


class AdapterError(ValueError):
    """Base of every adapter refusal; `code` is a stable machine-readable reason."""

    code = "invalid_adapter"


class AdapterPathError(AdapterError):
    """The path (or a symlink inside it) leaves the allowed adapter root, or is not a directory."""

    code = "adapter_path_outside_root"


class MissingAdapterFileError(AdapterError):
    code = "adapter_missing_file"


class PickleFormatError(AdapterError):
    """A pickle-based weight file (.bin, .pt, ...): loading one can execute code."""

    code = "adapter_pickle_format"


class CorruptAdapterError(AdapterError):
    code = "adapter_corrupt"


class RankLimitError(AdapterError):
    code = "adapter_rank_limit"


class SizeLimitError(AdapterError):
    code = "adapter_size_limit"


class BaseModelMismatchError(AdapterError):
    """Made for another base model: its name or a tensor shape does not match the served base."""

    code = "adapter_base_model_mismatch"


class TargetModuleError(AdapterError):
    """Its config targets modules the base model does not have."""

    code = "adapter_target_modules"


class UnsupportedAdapterError(AdapterError):
    """Valid peft, but a kind this server does not serve (not LoRA, DoRA, modules_to_save, ...)."""

    code = "adapter_unsupported"


class AdapterCapacityError(AdapterError):
    """Every resident adapter is in use, so none can be evicted to make room."""

    code = "adapter_capacity"


class AdapterDigestError(AdapterError):
    """The adapter's bytes differ from the sha256 registered for its version (changed or corrupted
    after registration): never served."""

    code = "adapter_digest_mismatch"
