"""`CallStore`: a `Store` whose every method is one `call(method_name, *args)`, e.g. to a
`MemoryStore` inside a Ray actor. The forwarding methods are built from `Store`'s public methods,
so a method added to the interface is forwarded too.
"""

from __future__ import annotations

import abc
import functools
import inspect
from collections.abc import Callable, Iterable, Mapping

from specserve.platform.state.store import Store, StoreError, StoreUnavailable

# answered by the CallStore itself: where it is, and closing it (the target outlives a caller)
LOCAL_METHODS = frozenset({"describe", "close"})


def forwarded_methods() -> tuple[str, ...]:
    """The public methods of `Store` that go through the call, sorted."""
    public = (name for name, _ in inspect.getmembers(Store, inspect.isfunction))
    return tuple(sorted(n for n in public if not n.startswith("_") and n not in LOCAL_METHODS))


def portable(value: object) -> object:
    """An argument as plain data that any transport can copy: a Mapping as a dict, a tuple as a
    tuple, any other non-string iterable (a list, a generator, dict keys, a set) as a list."""
    if isinstance(value, Mapping):
        return dict(value)
    if isinstance(value, tuple):
        return tuple(portable(item) for item in value)
    if isinstance(value, Iterable) and not isinstance(value, str | bytes):
        return [portable(item) for item in value]
    return value


def _forwarder(name: str) -> Callable[..., object]:
    method = getattr(Store, name)
    signature = inspect.signature(method)

    def forward(self: CallStore, *args, **kwargs):
        bound = signature.bind(self, *args, **kwargs)  # wrong arguments fail here, as TypeError
        return self._do(name, *(portable(arg) for arg in bound.args[1:]))

    # the interface method's name, docstring and signature; not its __dict__, which holds
    # __isabstractmethod__
    functools.update_wrapper(forward, method, updated=())
    forward.__qualname__ = f"CallStore.{name}"
    return forward


def _forwarding(cls: type[CallStore]) -> type[CallStore]:
    for name in forwarded_methods():
        setattr(cls, name, _forwarder(name))
    return abc.update_abstractmethods(cls)


@_forwarding
class CallStore(Store):
    """A `Store` whose every call goes through `call(method_name, *args)`: e.g. to a `MemoryStore`
    inside a Ray actor (`call = lambda m, *a: ray.get(getattr(actor, m).remote(*a), timeout=2)`),
    the in-cluster store when no Redis exists. Arguments travel positionally, as plain data
    (`portable`). Store errors of the target pass through; any other error of `call` (transport: actor
    gone, timeout) becomes `StoreUnavailable`."""

    kind = "memory"

    def __init__(self, call: Callable[..., object], where: str = "store actor") -> None:
        self._call = call
        self._where = where

    def describe(self) -> str:
        return self._where

    def _do(self, method: str, *args):
        try:
            return self._call(method, *args)
        except StoreError:
            raise
        except Exception as err:  # transport errors: actor gone, timeout
            raise StoreUnavailable(f"{self._where}: {type(err).__name__}: {err}") from err
