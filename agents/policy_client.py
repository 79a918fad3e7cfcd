"""The policy client: one chat completion through litellm, recorded as a `ModelStep`.

What a call asks for follows from the endpoint's kind (`agents.model_routes`): logprobs and
token ids only from arloop's policy server and vLLM, versioned model names only from arloop's.
With fallbacks the call goes through litellm's `Router` (each endpoint its own parameters and
retries, then the next), and the step records the endpoint that answered.
"""

from __future__ import annotations

import copy
import os
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from functools import cache
from typing import Any

from agents.decisions import Decided, ask_head
from agents.errors import ArloopError
from agents.events import ModelStep, ToolCallRequest
from agents.model_routes import TOKEN_KINDS, Endpoint, Kind, ModelRoute, Provider, endpoint_kind
from agents.model_routes import token_params as _token_params
from agents.policy_stream import OnDelta, StreamedCompletion


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
    provider: Provider = "auto"
    """What the endpoint supports (`agents.model_routes`): `arloop`, `vllm`, `other` or `auto`."""
    fallbacks: tuple[Endpoint, ...] = ()
    """Endpoints tried in turn when this one fails (after its retries): litellm's Router."""

    @property
    def kind(self) -> Kind:
        return endpoint_kind(self.model, self.provider)

    @property
    def names_versions(self) -> bool:
        """Whether the model string names the version arm (`arloop@candidate`, `arloop@v3`):
        asked for, and the endpoint is arloop's policy server (no other knows such names)."""
        return self.versioned and self.kind == "arloop"

    @property
    def versions_routed(self) -> bool:
        """Whether runs are routed by version arm (threads get canary arms): arloop's server
        by name; a vLLM by the adapters a sync process loads for each arm."""
        return self.versioned and self.kind in TOKEN_KINDS

    def routed(self, route: ModelRoute) -> PolicyConfig:
        """This process's call settings on an agent's own model route."""
        return replace(
            self,
            model=route.model,
            api_base=route.api_base,
            api_key=route.key(),
            provider=route.provider,
            fallbacks=route.fallbacks,
            retries=self.retries if route.retries is None else route.retries,
        )

    def endpoints(self) -> list[Endpoint]:
        """The primary endpoint, then its fallbacks."""
        primary = Endpoint(
            model=self.model, api_base=self.api_base, api_key=self.api_key, provider=self.provider
        )
        return [primary, *self.fallbacks]


@dataclass(frozen=True)
class Generation:
    """How one agent samples, sent with each of its calls; a field left None keeps the
    process's setting (`PolicyConfig`), or the endpoint's default."""

    temperature: float | None = None
    max_tokens: int | None = None
    """Completion tokens per call: the agent's answers are short, and a model that rambles
    costs the user seconds per token on a CPU."""
    stop: tuple[str, ...] = ()
    """Stop sequences (OpenAI allows 4)."""
    include_stop: bool = False
    """Keep the stop sequence in the text (vLLM's `include_stop_str_in_output`, which arloop's
    policy server implements): a reply that ends at `Triage: urgent` keeps its level."""
    frequency_penalty: float | None = None
    """OpenAI's: each logit minus the penalty times the token's count so far in the completion."""
    presence_penalty: float | None = None
    """OpenAI's: each logit minus the penalty once the token has appeared in the completion."""

    def request(self, config: PolicyConfig) -> tuple[dict[str, Any], dict[str, Any]]:
        """(litellm keyword arguments, extra body fields) for a call under `config`."""
        kwargs: dict[str, Any] = {}
        temperature = self.temperature if self.temperature is not None else config.temperature
        max_tokens = self.max_tokens if self.max_tokens is not None else config.max_tokens
        for key, value in (
            ("temperature", temperature),
            ("max_tokens", max_tokens),
            ("seed", config.seed),
            ("frequency_penalty", self.frequency_penalty),
            ("presence_penalty", self.presence_penalty),
        ):
            if value is not None:
                kwargs[key] = value
        if self.stop:
            kwargs["stop"] = list(self.stop)
        extra = {"include_stop_str_in_output": True} if self.stop and self.include_stop else {}
        return kwargs, extra


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
        self._endpoints = config.endpoints()
        self._routers: dict[tuple[str | None, str], Any] = {}
        self._sdk: Any = None  # the OpenAI SDK's client of arloop's own server (`respond`)

    def model_for(self, arm: str | None) -> str:
        """The model string for a version arm (`champion`, `candidate`) or the plain model;
        arms name versions on arloop's policy server only."""
        if self.config.names_versions and arm:
            return f"{self.config.model}@{arm}"
        return self.config.model

    async def complete(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] = (),
        *,
        arm: str | None = None,
        index: int = 0,
        on_delta: OnDelta | None = None,
        sampling: Generation | None = None,
    ) -> ModelStep:
        """One completion; PolicyError (502/504) when the endpoint (and every fallback) fails.

        `sampling`: the calling agent's own settings over the process's (`PolicyConfig`).
        With `on_delta` the endpoint streams and each piece of text is handed over as it comes;
        the step recorded is the same (token ids and logprobs come per chunk).
        """
        start = time.perf_counter()
        wire, tool_list = copy.deepcopy(messages), list(tools)
        kwargs, extra = (sampling or Generation()).request(self.config)
        kwargs |= {"messages": wire, **({"tools": tool_list} if tool_list else {})}
        call, kwargs = self._call(arm, kwargs, extra)
        model = self.model_for(arm)
        if on_delta is not None:
            streamed = await self._stream(call, kwargs, on_delta)
            latency_ms = (time.perf_counter() - start) * 1000
            step = streamed.step(messages, tools, model, index, latency_ms)
            return self._step(step, self._answered(streamed.hidden_params), arm)
        async with self._errors():
            response = await call(**kwargs)
        latency_ms = (time.perf_counter() - start) * 1000
        step = to_model_step(response, messages, tools, model, index, latency_ms)
        return self._step(step, self._answered(getattr(response, "_hidden_params", None)), arm)

    async def head(self, name: str, text: str, *, arm: str | None) -> Decided | None:
        """A decision head's label for `text` on the version `arm` names (`agents.decisions`);
        None where the endpoint is not arloop's policy server."""
        if self.config.kind != "arloop":
            return None
        model = self.model_for(arm)
        return await ask_head(self.config.api_base, self.config.api_key, model, name, text)

    async def respond(self, request: dict[str, Any], *, arm: str | None) -> Any:
        """litellm's answer to a client's own OpenAI request (the agent API's
        `/v1/chat/completions`), on the version `arm` names: the process's sampling fills only
        what the request leaves out, and token ids and logprobs are asked for wherever the
        endpoint gives them, whatever the request says. With `stream` an async iterator of
        chunks. PolicyError as `complete`; parameters are never dropped silently."""
        kwargs, extra = Generation().request(self.config)
        if self._passes_through() and not request.get("stream"):
            async with self._errors():
                return await self._pass_through(arm, kwargs | request, extra)
        call, kwargs = self._call(arm, kwargs | request, extra)
        kwargs.pop("drop_params", None)  # another provider refuses what it cannot take
        if not request.get("stream"):
            async with self._errors():
                return await call(**kwargs)
        return self._chunks(call, kwargs)

    def _passes_through(self) -> bool:
        """Whether a client's request goes to the endpoint as it is, with the OpenAI SDK:
        arloop's own policy server alone (it speaks OpenAI's wire and names versions), no
        fallbacks to route over. litellm's translation is for other providers, and cost a
        call 60 % of the agent API's own CPU here (`bench/bench_chat_endpoint.py`)."""
        return self.config.kind == "arloop" and not self.config.fallbacks

    async def _pass_through(
        self, arm: str | None, body: dict[str, Any], extra: dict[str, Any]
    ) -> Any:
        """The request sent on with the version's name and the token ids and logprobs asked
        for, as litellm sends it; an `openai` ChatCompletion (the server's extra fields kept:
        `prompt_token_ids`, each choice's `token_ids`, `engine`)."""
        from openai import AsyncOpenAI
        from openai.types.chat import ChatCompletion

        cfg = self.config
        if self._sdk is None:
            self._sdk = AsyncOpenAI(
                base_url=cfg.api_base,
                api_key=cfg.api_key or "none",
                timeout=cfg.timeout_s,
                max_retries=cfg.retries,
            )
        asks = _token_params(cfg.kind)
        sent = body | {"model": self.model_for(arm).split("/", 1)[-1], "logprobs": True}
        sent |= asks["extra_body"] | extra
        return await self._sdk.post("/chat/completions", body=sent, cast_to=ChatCompletion)

    async def _chunks(self, call: Any, kwargs: dict[str, Any]) -> AsyncIterator[Any]:
        async with self._errors():
            chunks = await call(**kwargs)
            async for chunk in chunks:
                yield chunk

    def recorded(self, step: ModelStep, hidden: Any, arm: str | None) -> ModelStep:
        """A step `respond` produced, as `complete` records it: the endpoint that answered
        (from litellm's `_hidden_params`), its model string and version."""
        return self._step(step, self._answered(hidden), arm)

    def _call(
        self, arm: str | None, kwargs: dict[str, Any], extra: dict[str, Any]
    ) -> tuple[Any, dict[str, Any]]:
        """(the coroutine function, its arguments): litellm itself for one endpoint, its
        Router over the primary and the fallbacks otherwise."""
        cfg = self.config
        if not cfg.fallbacks:
            primary = self._endpoint_params(self._endpoints[0], arm, extra)
            direct = {"timeout": cfg.timeout_s, "max_retries": cfg.retries}
            return _litellm().acompletion, kwargs | primary | direct
        key = (arm, repr(sorted(extra.items())))
        if key not in self._routers:
            self._routers[key] = self._router(arm, extra)
        return self._routers[key].acompletion, kwargs | {"model": "0"}

    def _router(self, arm: str | None, extra: dict[str, Any]) -> Any:
        """litellm's Router: deployment `0` the primary, `1`, `2`, ... its fallbacks in turn."""
        cfg = self.config
        model_list = [
            {
                "model_name": str(n),
                "litellm_params": self._endpoint_params(e, arm if n == 0 else None, extra)
                | {"max_retries": 0, "timeout": cfg.timeout_s},
                "model_info": {"id": str(n)},
            }
            for n, e in enumerate(self._endpoints)
        ]
        chain = [str(n) for n in range(1, len(model_list))]
        return _litellm().Router(
            model_list=model_list,
            fallbacks=[{"0": chain}],
            num_retries=cfg.retries,
            timeout=cfg.timeout_s,
            retry_after=0,
        )

    def _endpoint_params(
        self, endpoint: Endpoint, arm: str | None, extra: dict[str, Any]
    ) -> dict[str, Any]:
        """What one endpoint is sent: its model (versioned on arloop's primary), address and
        key, and logprobs and token ids where its kind gives them."""
        model = self.model_for(arm) if endpoint is self._endpoints[0] else endpoint.model
        params = {"model": model, "api_base": endpoint.api_base, "api_key": endpoint.key()}
        asks = _token_params(endpoint.kind)
        if endpoint.kind in TOKEN_KINDS:
            asks["extra_body"] = asks["extra_body"] | extra
        return params | asks

    def _answered(self, hidden: Any) -> int:
        """Which endpoint answered: the Router names its deployment; else the primary."""
        which = hidden.get("model_id") if isinstance(hidden, dict) else None
        n = int(which) if which is not None and str(which).isdigit() else 0
        return n if n < len(self._endpoints) else 0

    def _step(self, step: ModelStep, n: int, arm: str | None) -> ModelStep:
        """The step as endpoint `n` answered it: its model string, and for another provider
        that string as the version (its `system_fingerprint` is no arloop version)."""
        model = self.model_for(arm) if n == 0 else self._endpoints[n].model
        update: dict[str, Any] = {"model": model}
        if self._endpoints[n].kind == "other":
            update["policy_version"] = model
        return step.model_copy(update=update)

    async def _stream(
        self, call: Any, kwargs: dict[str, Any], on_delta: OnDelta
    ) -> StreamedCompletion:
        out = StreamedCompletion()
        async with self._errors():
            chunks = await call(**kwargs, stream=True)
            out.hidden_params = getattr(chunks, "_hidden_params", None)
            async for chunk in chunks:
                text = out.add(chunk)
                if text:
                    on_delta(text)
        return out

    @asynccontextmanager
    async def _errors(self) -> AsyncIterator[None]:
        """Any failure of the upstream call, streamed or not, as a PolicyError."""
        from openai import APITimeoutError

        litellm = _litellm()
        try:
            yield
        except (litellm.Timeout, APITimeoutError) as exc:
            timeout = self.config.timeout_s
            raise PolicyError(504, f"policy endpoint timed out after {timeout:g} s") from exc
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
    choice_at: int = 0,
) -> ModelStep:
    """Record one litellm ModelResponse (its choice at `choice_at`, of `n`): output, tool
    calls, token ids, logprobs, version."""
    choice = response.choices[choice_at]
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
