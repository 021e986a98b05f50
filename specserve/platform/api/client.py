"""`specserve variants ...`: a small client of the admin API (bearer token), over the shared
HTTP client (`http_client.send`)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from urllib.parse import urlencode

import httpx

from specserve.env import CLIENT_URL, EnvVar
from specserve.platform.api.http_client import send


class AdminClient:
    def __init__(self, url: str, token: str) -> None:
        self.url, self.token = url.rstrip("/"), token

    @classmethod
    def from_env(cls, url: str | None, token: str | None, cache_dir: Path) -> AdminClient:
        token = token or os.environ.get(EnvVar.ADMIN_TOKEN)
        token_file = Path(cache_dir) / "admin-token"
        if not token and token_file.is_file():
            token = token_file.read_text().strip()
        if not token:
            raise ValueError(
                f"admin token: pass --token, set {EnvVar.ADMIN_TOKEN}, or run `specserve up` first"
            )
        return cls(url or os.environ.get(CLIENT_URL, "http://127.0.0.1:8000"), token)

    def call(self, method: str, path: str, body: dict | None = None) -> dict:
        try:
            response = send(method, f"{self.url}/admin{path}", body, self.token, timeout=60)
        except httpx.HTTPStatusError as err:
            try:
                message = err.response.json()["error"]["message"]
            except (ValueError, KeyError, TypeError):
                message = f"HTTP Error {err.response.status_code}: {err.response.reason_phrase}"
            raise ValueError(
                f"{method} {path}: HTTP {err.response.status_code}: {message}"
            ) from None
        except httpx.TransportError as err:
            raise ValueError(f"cannot reach {self.url}: {err}") from None
        return response.json() if response.content else {}

    def register(self, name: str, base_model: str, adapter: str, hints: dict) -> dict:
        body = {
            "name": name,
            "base_model": base_model,
            "adapter_path": str(adapter),
            "hints": hints,
        }
        return self.call("POST", "/variants", body)

    def list_variants(
        self, limit: int | None = None, after: str | None = None, page_size: int = 100
    ) -> dict:
        """Variants in name order after `after`, at most `limit` (None: every one), fetched a page
        at a time: {"variants": [...], "has_more": bool, "last_id": name or None}."""
        if limit is not None and limit < 1:
            raise ValueError("limit: at least 1")
        shown: list[dict] = []
        has_more = True
        while has_more and (limit is None or len(shown) < limit):
            size = page_size if limit is None else min(page_size, limit - len(shown))
            query = {"limit": size} | ({"after": after} if after is not None else {})
            page = self.call("GET", f"/variants?{urlencode(query)}")
            shown += page["variants"]
            has_more = bool(page.get("has_more")) and bool(page["variants"])
            if page["variants"]:
                after = page["variants"][-1]["name"]
        return {
            "variants": shown,
            "has_more": has_more,
            "last_id": shown[-1]["name"] if shown else None,
        }

    def follow(self, name: str, kind: str, poll_s: float = 2.0, log=print) -> dict:
        """Poll a drafter's training until it stops; returns the last status."""
        while True:
            status = self.call("GET", f"/variants/{name}/drafters").get(kind, {})
            log(f"{kind}: {status.get('state')} {100 * status.get('progress', 0):.0f}%")
            if status.get("state") not in ("queued", "running"):
                return status
            time.sleep(poll_s)

    def follow_retrain(
        self, name: str, kind: str, started_at: float, poll_s: float = 2.0, log=print
    ) -> dict:
        """Poll the retrain of `name`'s `kind` drafter begun at `started_at` until it ends;
        returns the drafter's last status."""
        while True:
            status = self.call("GET", f"/variants/{name}/drafters").get(kind, {})
            found = [r for r in status.get("retrains", []) if r["started_at"] == started_at]
            state = found[0]["state"] if found else "gone"
            log(f"{kind} retrain: {state} {100 * (found[0]['progress'] if found else 1):.0f}%")
            if state not in ("queued", "running"):
                return status
            time.sleep(poll_s)
