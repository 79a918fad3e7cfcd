"""Which model an agent calls, what its endpoint supports, and the fallbacks behind it.

An endpoint is one of three kinds, and what a call asks for follows from it:

- `arloop`: arloop's own policy server. Versioned names (`arloop@champion`, `@candidate`,
  `@v3`), token ids and logprobs (trainable runs).
- `vllm`: a vLLM server (`hosted_vllm/...`). Token ids and logprobs; no version names.
- `other`: any other litellm provider (OpenAI, Anthropic, Ollama, a hosted OpenAI-compatible
  API). Plain requests: no logprobs, no `return_token_ids`, no vLLM-only fields, and settings
  the provider does not take dropped by litellm (`drop_params`). Its runs are logged without
  token ids, and the learner lets them go as untrainable (`no_token_ids`).

`auto` (the default) reads the kind from the model string: `hosted_vllm/<name>` is vLLM,
`openai/arloop` (the name the policy server serves) is arloop, anything else is `other`; a
policy server serving another name, or a vLLM behind `openai/`, says so with `provider`.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr

Provider = Literal["auto", "arloop", "vllm", "other"]
Kind = Literal["arloop", "vllm", "other"]
SERVED_NAME = "arloop"
"""The model name arloop's policy server answers to by default (`ARLOOP_SERVED_NAME`)."""
TOKEN_KINDS = ("arloop", "vllm")
"""Endpoints asked for token ids and logprobs: their runs are trainable."""


def endpoint_kind(model: str, provider: Provider = "auto") -> Kind:
    """What an endpoint is, from `provider`, or (auto) from its litellm model string."""
    if provider != "auto":
        return provider
    prefix, _, name = model.partition("/")
    if prefix == "hosted_vllm":
        return "vllm"
    if prefix == "openai" and name.partition("@")[0] == SERVED_NAME:
        return "arloop"
    return "other"


def token_params(kind: Kind) -> dict[str, Any]:
    """The litellm arguments that ask an endpoint of `kind` for logprobs and token ids."""
    if kind in TOKEN_KINDS:
        return {"logprobs": True, "extra_body": {"return_token_ids": True}}
    return {"drop_params": True}


class Endpoint(BaseModel):
    """One model behind one endpoint."""

    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)

    model: str = Field(min_length=1)
    """Any litellm model string: `anthropic/claude-3-5-haiku-latest`, `ollama_chat/llama3`,
    `openai/<name>` for an OpenAI-compatible endpoint, `hosted_vllm/<name>` for vLLM."""
    api_base: str | None = None
    """The endpoint's URL; unset: the provider's own (litellm's default for it)."""
    api_key: SecretStr | None = None
    """Its key; unset: litellm reads the provider's usual variable (`ANTHROPIC_API_KEY`, ...)."""
    provider: Provider = "auto"
    """What the endpoint supports: `arloop`, `vllm`, `other`, or `auto` (from the model string)."""

    @property
    def kind(self) -> Kind:
        return endpoint_kind(self.model, self.provider)

    def key(self) -> str | None:
        return self.api_key.get_secret_value() if self.api_key is not None else None


class ModelRoute(Endpoint):
    """An agent's own model: its endpoint, and the endpoints tried in turn when it fails."""

    fallbacks: tuple[Endpoint, ...] = ()
    """Tried in order (each after its own retries) when the one before fails: litellm's Router."""
    retries: int | None = Field(None, ge=0)
    """Retries of each endpoint on connection errors, timeouts, 429 and 5xx; unset: the
    process's (`ARLOOP_POLICY_RETRIES`)."""


class ModelRouteError(ValueError):
    """A per-agent model setting names no served agent; the message says which and the fix."""
