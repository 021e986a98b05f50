"""Variant visibility by tenant key and the store circuit breaker, without HTTP."""

from __future__ import annotations

import pytest

from specserve.platform.api.errors import ApiError
from specserve.platform.api.resolve import Access, StoreBreaker
from specserve.platform.settings import TenantKeys


def test_tenant_variants_are_visible_only_with_their_key():
    access = Access(TenantKeys(variants_by_key={"key-a": frozenset({"alpha"})}))
    mine, anonymous = access.allowed("key-a"), access.allowed(None)
    assert access.visible("alpha", mine) and not access.visible("alpha", anonymous)
    assert access.visible("public", anonymous)  # a variant no tenant owns
    with pytest.raises(ApiError) as err:
        access.allowed("forged")
    assert err.value.status == 401 and err.value.code == "invalid_api_key"


def test_without_tenant_keys_everything_is_visible():
    access = Access(TenantKeys())
    assert access.allowed("anything") is None and access.visible("alpha", None)


def test_the_breaker_opens_for_its_backoff_and_resets():
    breaker = StoreBreaker(backoff_s=60)
    assert not breaker.open
    breaker.trip()
    assert breaker.open
    breaker.reset()
    assert not breaker.open
