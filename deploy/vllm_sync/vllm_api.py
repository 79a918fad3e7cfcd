"""vLLM's runtime LoRA API, as `vllm serve --enable-lora` answers it with
`VLLM_ALLOW_RUNTIME_LORA_UPDATING=True` (vllm/entrypoints/openai/serving_models.py):

- `GET /v1/models`: `{"object": "list", "data": [{"id", "root", "parent", ...}]}`: the base
  model(s), then one card per loaded adapter (`id` its name, `root` its path, `parent` the base).
- `POST /v1/load_lora_adapter` `{"lora_name", "lora_path"}`: 200 with a text body
  (`Success: LoRA adapter '<name>' added successfully.`); 400 when the name is already loaded
  or a field is missing; 404 when no adapter is found at the path; 500 when the engine
  fails to load it. Errors are `{"error": {"message", "type", "param", "code"}}` (older
  releases: the same fields at the top level).
- `POST /v1/unload_lora_adapter` `{"lora_name"}`: 200 text; 404 when the name is not loaded.

Without the environment variable the two POST routes do not exist (404 `{"detail": ...}`).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import httpx

MISSING_ROUTE = "is vLLM started with VLLM_ALLOW_RUNTIME_LORA_UPDATING=True and --enable-lora?"


class Card(NamedTuple):
    """One model vLLM lists: its `root` (an adapter's path, the base's model) and `parent`
    (the base an adapter runs on; None for a base model)."""

    root: str | None
    parent: str | None


class VllmDown(RuntimeError):
    """vLLM could not be reached (connection refused, timeout, a dropped connection)."""


class VllmRefused(RuntimeError):
    """vLLM answered with an error status; `status` and vLLM's own message."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message}")
        self.status, self.message = status, message


class VllmApi:
    """A blocking client of one vLLM server's model and LoRA routes."""

    def __init__(self, url: str, api_key: str | None = None, timeout_s: float = 120.0) -> None:
        self.url = url.rstrip("/").removesuffix("/v1")
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.http = httpx.Client(base_url=self.url, headers=headers, timeout=timeout_s)

    def models(self) -> dict[str, Card]:
        """What vLLM serves, by model id: the base model(s) and every loaded adapter."""
        response = self._call("GET", "/v1/models")
        try:
            cards = response.json()["data"]
            return {c["id"]: Card(c.get("root"), c.get("parent")) for c in cards}
        except (ValueError, KeyError, TypeError) as exc:  # not vLLM's model list
            raise VllmRefused(response.status_code, f"not a model list: {exc!r}") from exc

    def load(self, name: str, path: str) -> None:
        """Load the LoRA adapter at `path` (as vLLM's filesystem sees it) under `name`."""
        self._call("POST", "/v1/load_lora_adapter", {"lora_name": name, "lora_path": path})

    def unload(self, name: str) -> None:
        """Unload the adapter `name`; requests in flight on it must be drained first."""
        self._call("POST", "/v1/unload_lora_adapter", {"lora_name": name})

    def close(self) -> None:
        self.http.close()

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> httpx.Response:
        try:
            response = self.http.request(method, path, json=body)
        except httpx.TransportError as exc:  # refused, reset, timed out
            raise VllmDown(f"vLLM at {self.url} is unreachable: {type(exc).__name__}") from exc
        if response.status_code >= 400:
            raise VllmRefused(response.status_code, _message(response))
        return response


def _message(response: httpx.Response) -> str:
    """vLLM's error message, whichever shape its release answers in."""
    try:
        body = response.json()
    except ValueError:
        return response.text[:300] or response.reason_phrase
    if isinstance(body, dict):
        error = body.get("error")
        if isinstance(error, dict) and error.get("message"):
            return str(error["message"])[:300]
        if body.get("message"):
            return str(body["message"])[:300]
        if body.get("detail") == "Not Found":
            return f"Not Found: {MISSING_ROUTE}"
    return str(body)[:300]
