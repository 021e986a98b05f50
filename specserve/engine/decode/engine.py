"""`Engine`: the `Decoder` every caller outside the conformance probe builds; it admits its model
first (`families.family_of`: the known-good list, else the probe's verdict), so an architecture
the engine cannot serve is refused at construction, not mid-stream."""

from __future__ import annotations

from specserve.engine import families
from specserve.engine.decode.core import Decoder


class Engine(Decoder):
    """A `Decoder` over an admitted model; raises `families.UnsupportedModel` for an architecture
    `families.family_of` refuses."""

    def __init__(self, model, *args, **kwargs) -> None:
        """`Decoder`'s arguments; the family check comes first."""
        families.family_of(model.config)
        super().__init__(model, *args, **kwargs)
