"""CallStore beyond the shared contract: every public Store method goes through the call (so a
method added to Store cannot miss the actor path), with plain positional arguments; errors of the
transport become StoreUnavailable, the target's StoreErrors pass through."""

from __future__ import annotations

import inspect
from types import MappingProxyType

import pytest

from specserve.platform.state.call_store import LOCAL_METHODS, CallStore, portable
from specserve.platform.state.store import Store, StoreError, StoreUnavailable


class Recorder:
    """A call target that records (method, args) and answers None."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple]] = []

    def __call__(self, method: str, *args):
        self.calls.append((method, args))


def public_store_methods() -> list[str]:
    return sorted(
        name
        for name, value in vars(Store).items()
        if callable(value) and not name.startswith("_") and name not in LOCAL_METHODS
    )


def required_args(name: str) -> list[str]:
    params = list(inspect.signature(getattr(Store, name)).parameters.values())[1:]
    return [
        f"a{i}"
        for i, p in enumerate(params)
        if p.default is p.empty and p.kind == p.POSITIONAL_OR_KEYWORD
    ]


@pytest.mark.parametrize("name", public_store_methods())
def test_every_public_store_method_goes_through_the_call(name):
    recorder = Recorder()
    args = required_args(name)
    getattr(CallStore(recorder), name)(*args)
    assert recorder.calls == [(name, tuple(args))]


def test_the_interface_is_covered_and_the_store_is_concrete():
    assert public_store_methods()  # the listing above found the interface
    assert not CallStore.__abstractmethods__
    store = CallStore(Recorder(), "here")
    assert isinstance(store, Store) and store.describe() == "here"
    store.close()  # answered locally: the target outlives this caller
    with pytest.raises(AttributeError):
        store.not_a_store_method  # noqa: B018


def test_arguments_travel_positionally_as_plain_data():
    recorder = Recorder()
    store = CallStore(recorder)
    store.pool_push("p", (m for m in "ab"), cap=3, ttl_s=1.5)
    store.hset("m", MappingProxyType({"f": "1"}))  # a read-only view pickle cannot copy
    store.remove([("k", "f")], {"a": 1}.keys(), bump="g")
    store.incr("n")  # an omitted default is left to the target
    assert recorder.calls == [
        ("pool_push", ("p", ["a", "b"], 3, 1.5)),
        ("hset", ("m", {"f": "1"})),
        ("remove", ([("k", "f")], ["a"], "g")),
        ("incr", ("n",)),
    ]
    assert type(recorder.calls[1][1][1]) is dict


def test_wrong_arguments_fail_here_before_any_call():
    recorder = Recorder()
    with pytest.raises(TypeError):
        CallStore(recorder).get("a", "b")
    assert recorder.calls == []


def test_transport_errors_are_unavailable_and_store_errors_pass_through():
    def gone(method, *args):
        raise ConnectionError("actor died")

    def wrong_type(method, *args):
        raise StoreError("key 'k' holds a dict, not a str")

    with pytest.raises(StoreUnavailable, match="actor died"):
        CallStore(gone, "ray actor x").get("k")
    with pytest.raises(StoreError) as caught:
        CallStore(wrong_type).get("k")
    assert not isinstance(caught.value, StoreUnavailable)


def test_portable():
    assert portable({"a": 1}.keys()) == ["a"] and portable("ab") == "ab"
    assert portable(({"x": 1}, [("k", "f")])) == ({"x": 1}, [("k", "f")])
