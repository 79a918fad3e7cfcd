"""One settings class per process, read from `ARLOOP_*` environment variables and `.env`.

Each knob is declared once, with its docstring: here, or in the config model it belongs to.
The learner's models nest inside `LearnerSettings` (`deploy/learn/settings.py`, apart so that
the serving processes never import the learner) and are set with `__` between the parts
(`ARLOOP_TRAIN__LEARNING_RATE=1e-4`, `ARLOOP_GUARDS__MAX_KL=0.3`, or a whole model as JSON:
`ARLOOP_CANARY='{"enabled": false}'`). The policy endpoint (`ARLOOP_POLICY_*`) is one
declaration shared by the agent API and the learner's eval runs, with one method that builds
the policy client's configuration. A variable renamed since an earlier version is refused
with its new name, never silently ignored (a class's `renamed` table).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import Field, ValidationError, model_validator
from pydantic_core import InitErrorDetails, PydanticCustomError
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from agents.policy_client import PolicyConfig

DEV_SECRET = "arloop-development-secret-do-not-use-in-production"
DEV_API_KEY = "dev-key"
PREFIX = "ARLOOP_"


class CommonSettings(BaseSettings):
    """What every arloop process shares."""

    model_config = SettingsConfigDict(
        env_prefix=PREFIX,
        env_file=".env",
        extra="ignore",
        env_nested_delimiter="__",
        use_attribute_docstrings=True,
    )
    renamed: ClassVar[dict[str, str]] = {}
    """Old variable -> what to set instead; setting an old one is an error naming the new."""

    env: Literal["development", "production"] = "development"
    """`production` refuses default secrets and open API keys."""
    redis_url: str | None = None
    """Redis to use; unset starts (or reuses) the embedded server under `data_dir/redis`."""
    data_dir: Path = Path(".arloop")
    """Where the embedded Redis, the learner's store, checkpoints and reports live."""
    log_level: str = "INFO"
    """Python logging level of the process (DEBUG, INFO, WARNING, ...)."""
    log_format: Literal["json", "text"] = "json"
    """Log lines as JSON objects (`json`, for collectors) or plain `text` for people."""

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        _refuse_renamed(settings_cls, env_settings, dotenv_settings)
        return init_settings, env_settings, dotenv_settings, file_secret_settings


def _refuse_renamed(settings_cls: type[BaseSettings], *sources: PydanticBaseSettingsSource) -> None:
    """A ValidationError naming the new variable for each old one set in the environment or `.env`."""
    errors: list[InitErrorDetails] = []
    for old, new in getattr(settings_cls, "renamed", {}).items():
        for source in sources:
            value = getattr(source, "env_vars", {}).get(old.lower())  # keys are lower-cased
            field = old.removeprefix(PREFIX).lower()
            if value is None or (field in settings_cls.model_fields and value.startswith("{")):
                continue  # unset, or the new nested model given whole, as JSON
            message = PydanticCustomError(
                "renamed_setting", "{old} is no longer read: set {new}", {"old": old, "new": new}
            )
            errors.append(InitErrorDetails(type=message, loc=(old,), input=value))
            break
    if errors:
        raise ValidationError.from_exception_data(settings_cls.__name__, errors)


class PolicyEndpointSettings(CommonSettings):
    """The OpenAI-compatible endpoint agents call through litellm (the agent API, and the
    learner's eval runs); `policy_config()` is how the process calls it."""

    policy_api_base: str = "http://127.0.0.1:8001/v1"
    """OpenAI-compatible endpoint the agents call through litellm (the learner's eval runs need
    arloop's own policy server: they pin versions, `arloop@v3`)."""
    policy_model: str = "openai/arloop"
    """Any litellm model string; `openai/<name>` for an OpenAI-compatible endpoint."""
    policy_api_key: str = "none"
    """API key sent to the policy endpoint (arloop's policy server ignores it)."""
    policy_timeout_s: float = Field(60.0, gt=0.0)
    """Seconds one model call may take before it fails (504 on the agent API)."""
    policy_temperature: float | None = None
    """Sampling temperature the agents send to the policy; unset leaves the endpoint's default
    (1.0 on arloop's policy server). The learner's sub-rounds resample at it."""
    policy_max_tokens: int | None = 512
    """Completion tokens per model call of the agents (and of the learner's resampling)."""

    def policy_config(self) -> PolicyConfig:
        """The policy client's configuration: this endpoint, called as this process calls it."""
        return PolicyConfig(
            model=self.policy_model,
            api_base=self.policy_api_base,
            api_key=self.policy_api_key,
            timeout_s=self.policy_timeout_s,
            **self._policy_calls(),
        )

    def _policy_calls(self) -> dict[str, Any]:
        """The process's own call knobs (retries, versions, sampling) for `policy_config`."""
        return {}


class ModelSettings(CommonSettings):
    """The base model, for the processes that load one (policy server, learner)."""

    base_model: str = "smollm2"
    """`smollm2` (bundled SmolLM2-135M-Instruct), a Hugging Face id or path, or `tiny` (tests)."""
    model_cache: Path = Path.home() / ".cache" / "arloop"
    """Where `smollm2` is converted to safetensors and `tiny` built, once per cache."""
    tool_format: Literal["auto", "hermes", "line"] = "auto"
    """How tools and tool calls are written in the prompt (the policy server renders them, the
    learner replays runs alike): `hermes` (`<tool_call>{json}`), or
    `line` (`CALL calculator: 2+3`, which SmolLM2-135M follows where it cannot write Hermes);
    `auto` is `line` for the bundled `smollm2`, `hermes` for any other model."""


class AgentApiSettings(PolicyEndpointSettings):
    """`arloop serve agents`: the agent API."""

    host: str = "127.0.0.1"
    """Interface the agent API listens on."""
    port: int = 8000
    """Port the agent API listens on."""
    api_keys: list[str] = Field(default_factory=lambda: [DEV_API_KEY])
    """Bearer keys clients must send; JSON list in the environment: '["k1","k2"]'."""
    secret_key: str = DEV_SECRET
    """Signs feedback tokens (HMAC-SHA256). Must be set outside development."""
    policy_retries: int = Field(2, ge=0)
    """Retries of a model call on connection errors, timeouts, 429 and 5xx (with backoff)."""
    policy_versioned: bool = True
    """Route by policy version (`<model>@champion`, `@candidate`): needs arloop's policy server."""
    canary_share: float = Field(0.10, ge=0.0, le=1.0)
    """Share of new threads sent to the `candidate` version while one exists."""
    packs: list[str] = Field(default_factory=lambda: ["tutoring", "medical"])
    """Agent packs to serve: built-in names, or `module:attr` for a team's own `Pack`."""
    max_input_chars: int = 8000
    """Longest user input a run accepts (422 above)."""
    feedback_token_ttl_s: int = 7 * 24 * 3600
    """How long a run's feedback token stays valid."""
    feedback_rate_per_minute: int = 60
    """Feedback events one user may send per minute before 429."""
    run_rate_per_minute: int = 120
    """Runs one user may start per minute before 429."""
    max_body_bytes: int = 256 * 1024
    """Request bodies above this size are refused with 413 before they are parsed."""
    scrub_phi: bool = True
    """Scrub PII/PHI (agents.pii) from trajectories and memories before they reach Redis."""
    thread_ttl_s: int | None = 30 * 24 * 3600
    """Threads (checkpoints and records) idle this long expire; unset keeps them forever."""
    thread_lock_s: float = 300.0
    """Longest a run may hold its thread; a crashed run's lock frees itself after this."""
    checkpoint_durability: Literal["exit", "async", "sync"] = "exit"
    """When thread state is written: at the end of each run (`exit`, fewest Redis writes),
    or after every step (`async`/`sync`, resumable mid-run)."""
    memory_max_items: int = 200
    """Reflections (and facts) kept per user, task kind and kind; the oldest fall off."""
    redis_timeout_s: float = 5.0
    """Socket timeout for Redis; a Redis that does not answer in time is a 503."""

    def _policy_calls(self) -> dict[str, Any]:
        return {
            "retries": self.policy_retries,
            "versioned": self.policy_versioned,
            "temperature": self.policy_temperature,
            "max_tokens": self.policy_max_tokens,
        }

    @model_validator(mode="after")
    def _no_default_secrets_in_production(self) -> AgentApiSettings:
        if self.env == "production":
            if self.secret_key == DEV_SECRET or len(self.secret_key) < 32:
                raise ValueError(
                    "ARLOOP_SECRET_KEY must be set to a random string of 32+ characters in "
                    "production (e.g. `python -c 'import secrets; print(secrets.token_hex(32))'`)"
                )
            if DEV_API_KEY in self.api_keys:
                raise ValueError(
                    f"ARLOOP_API_KEYS still holds the development key {DEV_API_KEY!r}: set it to "
                    "your clients' own keys in production, e.g. ARLOOP_API_KEYS='[\"<random>\"]'"
                )
        return self


class PolicyServerSettings(ModelSettings):
    """`arloop serve policy`: the embedded OpenAI-compatible policy server."""

    host: str = "127.0.0.1"
    """Interface the policy server listens on."""
    port: int = 8001
    """Port the policy server listens on."""
    served_name: str = "arloop"
    """The model name clients use: `arloop`, `arloop@champion`, `arloop@v3`."""
    max_tokens_cap: int = 1024
    """Most completion tokens one choice may ask for (`max_tokens` above is cut to this)."""
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
    llamacpp_quant: Literal["f16", "q8_0", "f32"] = "f16"
    """Weights of the llama.cpp export. Measured on SmolLM2-135M (README "Figures"): `f16`
    serves the learner's greedy outputs (7-8 of 8 prompts) with |served - learner's fp32|
    logprob 0.0015 a token; `q8_0` is 1.15-1.4x faster but changes most greedy outputs (1 of 8
    kept) with a gap of 0.04 (the learner then recomputes its behaviour logprobs); `f32` is
    the slowest."""
