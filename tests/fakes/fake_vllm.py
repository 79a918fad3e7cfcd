"""A fake `vllm serve <base> --enable-lora` with VLLM_ALLOW_RUNTIME_LORA_UPDATING=True, over
real HTTP: the routes `arloop serve vllm-sync` and the agents use, with vLLM's request and
response bodies and error codes (vllm/entrypoints/openai/serving_models.py, api_server.py):

- `GET /v1/models`: the base card, then one card per adapter (`id` name, `root` path,
  `parent` the base).
- `POST /v1/load_lora_adapter` `{"lora_name", "lora_path", "load_inplace"?}`: 200 text;
  400 `InvalidUserInput` (a field empty, the name already loaded); 404 `NotFoundError` (no
  adapter at the path: no `adapter_config.json`); scripted refusals (`refuse_next`) for what
  only a real engine would refuse (out of memory, a rank above `--max-lora-rank`: 500/400).
- `POST /v1/unload_lora_adapter` `{"lora_name"}`: 200 text; 400 (empty); 404 (not loaded).
- `POST /v1/chat/completions`: 404 for a model it does not serve, else a scripted answer
  naming the model that answered, with `logprobs` and `return_token_ids` as vLLM gives them.
Errors are `{"error": {"message", "type", "param", "code"}}`; a body that does not
validate is a 400, a body that is not JSON a 415 (vLLM's `validate_json_request`).
"""

from __future__ import annotations

import json
import time
from collections import deque
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse
from pydantic import BaseModel

from tests.fakes.scripted_llm import fake_logprob, token_ids


class LoadLoRAAdapterRequest(BaseModel):
    lora_name: str
    lora_path: str
    load_inplace: bool = False


class UnloadLoRAAdapterRequest(BaseModel):
    lora_name: str
    lora_int_id: int | None = None


def error(message: str, err_type: str, status: int, param: str | None = None) -> JSONResponse:
    body = {"error": {"message": message, "type": err_type, "param": param, "code": status}}
    return JSONResponse(body, status_code=status)


class FakeVllm:
    """The fake's state: the base model, the adapters loaded, scripted refusals, requests."""

    def __init__(self, base_name: str = "smollm2", base_root: str = "/models/smollm2") -> None:
        self.base_name, self.base_root = base_name, base_root
        self.loras: dict[str, str] = {}
        self.refusals: deque[tuple[int, str]] = deque()
        self.requests: list[tuple[str, dict[str, Any]]] = []
        self.app = self._build()

    def refuse_next(self, status: int, message: str) -> None:
        """The next load fails as the engine would fail it (status, vLLM's message)."""
        self.refusals.append((status, message))

    def restart(self) -> None:
        """What a vLLM restart does to runtime-loaded adapters: forgets them."""
        self.loras.clear()

    def posted(self, route: str) -> list[dict[str, Any]]:
        return [body for path, body in self.requests if path == route]

    # -- routes ------------------------------------------------------------------------------

    def _build(self) -> FastAPI:
        app = FastAPI()

        @app.exception_handler(RequestValidationError)
        async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
            return error(str(exc.errors()[0]["msg"]), "BadRequestError", 400)

        @app.middleware("http")
        async def _json_only(request: Request, call_next):
            kind = request.headers.get("content-type", "")
            if request.method == "POST" and not kind.startswith("application/json"):
                return error(
                    "Unsupported Media Type: Only 'application/json' is allowed",
                    "UnsupportedMediaType",
                    415,
                )
            return await call_next(request)

        app.get("/v1/models")(self.models)
        app.post("/v1/load_lora_adapter")(self.load)
        app.post("/v1/unload_lora_adapter")(self.unload)
        app.post("/v1/chat/completions")(self.chat)
        return app

    async def models(self) -> dict[str, Any]:
        card = {"object": "model", "created": int(time.time()), "owned_by": "vllm"}
        data = [card | {"id": self.base_name, "root": self.base_root, "parent": None}]
        data += [
            card | {"id": name, "root": path, "parent": self.base_name}
            for name, path in self.loras.items()
        ]
        return {"object": "list", "data": data}

    async def load(self, body: LoadLoRAAdapterRequest):
        self.requests.append(("load", body.model_dump()))
        if not body.lora_name or not body.lora_path:
            return error(
                "Both 'lora_name' and 'lora_path' must be provided.", "InvalidUserInput", 400
            )
        if body.lora_name in self.loras and not body.load_inplace:
            return error(
                f"The lora adapter '{body.lora_name}' has already been loaded. If you want to "
                "load the adapter in place, set 'load_inplace' to True.",
                "InvalidUserInput",
                400,
            )
        folder = Path(body.lora_path)
        if not (folder / "adapter_config.json").is_file():
            message = f"Loading lora {body.lora_name} failed: No adapter found for {folder}"
            return error(message, "NotFoundError", 404)
        if self.refusals:
            status, message = self.refusals.popleft()
            return error(
                message, "BadRequestError" if status == 400 else "InternalServerError", status
            )
        try:
            json.loads((folder / "adapter_config.json").read_text())
        except ValueError as exc:
            return error(f"invalid adapter_config.json: {exc}", "BadRequestError", 400)
        self.loras[body.lora_name] = str(folder)
        return PlainTextResponse(f"Success: LoRA adapter '{body.lora_name}' added successfully.")

    async def unload(self, body: UnloadLoRAAdapterRequest):
        self.requests.append(("unload", body.model_dump()))
        if not body.lora_name:
            return error(
                "'lora_name' needs to be provided to unload a LoRA adapter.",
                "InvalidUserInput",
                400,
            )
        if body.lora_name not in self.loras:
            message = f"The lora adapter '{body.lora_name}' cannot be found."
            return error(message, "NotFoundError", 404)
        del self.loras[body.lora_name]
        return PlainTextResponse(f"Success: LoRA adapter '{body.lora_name}' removed successfully.")

    async def chat(self, request: Request):
        body = await request.json()
        self.requests.append(("chat", body))
        model = body.get("model")
        if model != self.base_name and model not in self.loras:
            return error(f"The model `{model}` does not exist.", "NotFoundError", 404, "model")
        text = f"answer from {model}"
        ids = token_ids(text)
        choice: dict[str, Any] = {
            "index": 0,
            "message": {"role": "assistant", "content": text},
            "finish_reason": "stop",
        }
        if body.get("logprobs"):
            content = [{"token": f"token_id:{i}", "logprob": fake_logprob(i)} for i in ids]
            choice["logprobs"] = {"content": content}
        answer: dict[str, Any] = {
            "id": "chatcmpl-fake",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": model,
            "choices": [choice],
            "usage": {
                "prompt_tokens": 3,
                "completion_tokens": len(ids),
                "total_tokens": 3 + len(ids),
            },
        }
        if body.get("return_token_ids"):
            choice["token_ids"] = ids
            answer["prompt_token_ids"] = [1, 2, 3]
        return answer
