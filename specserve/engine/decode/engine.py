"""`Engine`: the `Decoder` every caller outside the conformance probe builds; it admits its model
first (`families.family_of`: the known-good list, else the probe's verdict), so an architecture
the engine cannot serve is refused at construction, not mid-stream."""

from __future__ import annotations

from collections.abc import Callable

from specserve.engine import families
from specserve.engine.decode.core import Decoder


class Engine(Decoder):
    """A `Decoder` over an admitted model; raises `families.UnsupportedModel` for an architecture
    `families.family_of` refuses."""

    def __init__(
        self,
        model,
        tokenizer,
        eos_ids: frozenset[int],
        pad_width: Callable[[int], int] | None = None,
        drafters: dict[str, object] | None = None,
        invariant: bool = True,
    ) -> None:
        families.family_of(model.config)
        super().__init__(model, tokenizer, eos_ids, pad_width, drafters, invariant)
