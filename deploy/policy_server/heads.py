"""`POST /v1/heads/{name}`: a version's decision head's label for a user's message.

The head (`learner.policy.heads`) is a linear read-out of the *base* model's hidden states,
kept in the version's checkpoint folder; the base is loaded here once, in fp32 with
transformers, whatever engine decodes (a llama.cpp export's states are not what the head was
fitted on). A version without that head (v0, a pack without the decision, a round with fewer
than two labels) is a 404, which the agent reads as "the model's words stand".
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from fastapi import Request
from pydantic import BaseModel, ConfigDict, Field

from deploy.policy_server.access import Caller
from deploy.policy_server.completions import ServerState, lease
from deploy.policy_server.openai_wire import OpenAIError
from deploy.policy_server.prepare import target_of
from learner.policy.heads import Head, features, read_heads
from learner.policy.models import load_base
from learner.policy.storage import fetch_checkpoint

MAX_INPUT_CHARS = 16_000


class HeadRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str = Field(max_length=200, description="`arloop`, `arloop@candidate`, `arloop@v3`")
    input: str = Field(max_length=MAX_INPUT_CHARS, description="The user's message")


class HeadReader:
    """The base model's features and each version's heads, loaded on first use."""

    def __init__(self, base_model: str, model_cache: Any) -> None:
        self.base_model, self.model_cache = base_model, model_cache
        self._lock = threading.Lock()
        self._base: tuple[Any, Any] | None = None
        self._heads: dict[str, dict[str, Head]] = {}

    def heads_of(self, st: ServerState, version: str) -> dict[str, Head]:
        with self._lock:
            if version not in self._heads:
                record = st.versions.registry.get(version)
                folder = (
                    None
                    if record.checkpoint_kind == "base"
                    else fetch_checkpoint(record, self.model_cache)
                )
                self._heads[version] = read_heads(folder)
            return self._heads[version]

    def decide(self, head: Head, text: str) -> tuple[str, dict[str, float]]:
        with self._lock:  # one forward at a time: the base is shared, the calls are short
            if self._base is None:
                self._base = load_base(self.base_model, cache_dir=self.model_cache)
            model, tokenizer = self._base
            return head.predict(features(model, tokenizer, [text], head.layer)[0])


async def decide(name: str, req: HeadRequest, request: Request, key: Caller) -> dict[str, Any]:
    """The label the head `name` of the version `model` names gives `input`, with each
    label's probability; 404 when that version has no such head."""
    st: ServerState = request.app.state.policy
    reader: HeadReader = request.app.state.heads
    policy = await lease(st, target_of(req.model, st.settings.served_name), key)
    version = policy.version
    st.versions.unpin(policy)
    heads = await asyncio.to_thread(reader.heads_of, st, version)
    head = heads.get(name)
    if head is None or not head.fitted:
        raise OpenAIError(
            404,
            f"version {version} has no fitted head {name!r}",
            param="name",
            code="head_not_found",
        )
    label, probs = await asyncio.to_thread(reader.decide, head, req.input)
    return {
        "object": "head.decision",
        "name": name,
        "version": version,
        "label": label,
        "probability": probs[label],
        "probabilities": probs,
    }
