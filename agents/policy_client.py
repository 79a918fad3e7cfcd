"""The policy client: one chat completion through litellm, recorded as a `ModelStep`."""

from __future__ import annotations

import copy
import os
import time
from dataclasses import dataclass
from functools import cache
from typing import Any

from agents.errors import ArloopError
from agents.events import ModelStep, ToolCallRequest


@dataclass(frozen=True)
class PolicyConfig:
    """Where the policy is served and how to call it (read from settings in deploy/)."""

    model: str
    """Any litellm model string; `openai/<name>` for an OpenAI-compatible endpoint."""
    api_base: str | None = None
    api_key: str | None = None
    timeout_s: float = 60.0
    retries: int = 2
    """Retries of the HTTP call on connection errors, timeouts, 429 and 5xx (with backoff)."""
    versioned: bool = True
    """Name the version arm in the model string: `<model>@champion`, `<model>@candidate`."""
    temperature: float | None = None
    max_tokens: int | None = None
    seed: int | None = None
    """Sampling seed sent with every call (reproducible sampled runs in tests and benchmarks)."""


class PolicyError(ArloopError):
    """The model endpoint failed; `status` is the HTTP status the API answers (502 or 504)."""


@cache
def _litellm() -> Any:
    """Import litellm once, offline (its cost map would otherwise be fetched)."""
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    import litellm

    litellm.suppress_debug_info = True
    return litellm


def warm_up() -> None:
    """Import litellm now (seconds), so the first request does not pay for it."""
    _litellm()


class PolicyClient:
    """Calls the policy; every call comes back as a ModelStep with tokens and version."""

    def __init__(self, config: PolicyConfig) -> None:
        self.config = config

    def model_for(self, arm: str | None) -> str:
        """The model string for a version arm (`champion`, `candidate`) or the plain model."""
        if self.config.versioned and arm:
            return f"{self.config.model}@{arm}"
        return self.config.model

    async def complete(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] = (),
        *,
        arm: str | None = None,
        index: int = 0,
    ) -> ModelStep:
        """One completion; PolicyError (502/504) when the endpoint fails or times out."""
        model = self.model_for(arm)
        start = time.perf_counter()
        response = await self._call(model, copy.deepcopy(messages), list(tools))
        latency_ms = (time.perf_counter() - start) * 1000
        return to_model_step(response, messages, tools, model, index, latency_ms)

    async def _call(self, model: str, messages: list[dict], tools: list[dict]) -> Any:
        litellm = _litellm()
        cfg = self.config
        kwargs: dict[str, Any] = {"tools": tools} if tools else {}
        if cfg.temperature is not None:
            kwargs["temperature"] = cfg.temperature
        if cfg.max_tokens is not None:
            kwargs["max_tokens"] = cfg.max_tokens
        if cfg.seed is not None:
            kwargs["seed"] = cfg.seed
        try:
            return await litellm.acompletion(
                model=model,
                messages=messages,
                api_base=cfg.api_base,
                api_key=cfg.api_key,
                timeout=cfg.timeout_s,
                max_retries=cfg.retries,
                logprobs=True,
                extra_body={"return_token_ids": True},
                **kwargs,
            )
        except litellm.Timeout as exc:
            raise PolicyError(504, f"policy endpoint timed out after {cfg.timeout_s:g} s") from exc
        except Exception as exc:  # any failure of the upstream call is a bad gateway for us
            reason = f"policy endpoint failed: {type(exc).__name__}: {_first_line(exc)}"
            raise PolicyError(502, reason) from exc


def to_model_step(
    response: Any,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]],
    model: str,
    index: int,
    latency_ms: float,
) -> ModelStep:
    """Record one litellm ModelResponse: output, tool calls, token ids, logprobs, version."""
    choice = response.choices[0]
    message = choice.message
    calls = [
        ToolCallRequest(id=c.id, name=c.function.name, arguments=c.function.arguments or "")
        for c in (message.tool_calls or [])
    ]
    return ModelStep(
        index=index,
        messages=messages,
        tool_names=[t["function"]["name"] for t in tools],
        output=message.content,
        tool_calls=calls,
        finish_reason=choice.finish_reason,
        model=model,
        policy_version=getattr(response, "system_fingerprint", None) or response.model or model,
        prompt_token_ids=_ints(getattr(response, "prompt_token_ids", None)),
        completion_token_ids=_ints(getattr(choice, "token_ids", None)),
        logprobs=_logprobs(getattr(choice, "logprobs", None)),
        engine=_text(getattr(response, "engine", None)),
        latency_ms=latency_ms,
    )


def _text(value: Any) -> str | None:
    return value[:64] if isinstance(value, str) and value else None


def _ints(values: Any) -> list[int] | None:
    return [int(v) for v in values] if values else None


def _logprobs(logprobs: Any) -> list[float] | None:
    """Per-token logprobs from an OpenAI `logprobs.content` list (object or dict form)."""
    if logprobs is None:
        return None
    content = logprobs.get("content") if isinstance(logprobs, dict) else logprobs.content
    if not content:
        return None
    return [float(t["logprob"] if isinstance(t, dict) else t.logprob) for t in content]


def _first_line(exc: Exception) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:300] if text else ""
