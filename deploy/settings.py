"""One settings class per process, read from `ARLOOP_*` environment variables and `.env`.

Each knob is declared once, with its docstring: here, or in the config model it belongs to.
The learner's models nest inside `LearnerSettings` and are set with `__` between the parts
(`ARLOOP_TRAIN__LEARNING_RATE=1e-4`, `ARLOOP_GUARDS__MAX_KL=0.3`, or a whole model as JSON:
`ARLOOP_CANARY='{"enabled": false}'`). The policy endpoint (`ARLOOP_POLICY_*`) is one
declaration shared by the agent API and the learner's eval runs, with one method that builds
the policy client's configuration. A variable renamed since an earlier version is refused
with its new name, never silently ignored (`RENAMED`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import Field, ValidationError, model_validator
from pydantic_core import InitErrorDetails, PydanticCustomError
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from agents.policy_client import PolicyConfig
from learner.config import RoundConfig, TrainConfig
from learner.gate.canary import CanaryConfig
from learner.gate.eval_gate import GateConfig
from learner.gate.guards import GuardConfig

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
    policy_temperature: float | None = None
    """Sampling temperature sent to the policy; unset leaves the endpoint's default."""
    policy_max_tokens: int | None = 512
    """Completion tokens per model call."""
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
    """Prompt plus completion tokens; unset uses the model's `max_position_embeddings`."""
    prefix_cache: int = Field(8, ge=0)
    """Shared prompt heads (system prompt, worked example) whose KV is kept for reuse; 0: off."""
    tool_format: Literal["auto", "hermes", "line"] = "auto"
    """How tools and tool calls are written in the prompt: `hermes` (`<tool_call>{json}`), or
    `line` (`CALL calculator: 2+3`, which SmolLM2-135M follows where it cannot write Hermes);
    `auto` is `line` for the bundled `smollm2`, `hermes` for any other model."""


def _moved(section: str, *fields: str, old_prefix: str = "") -> dict[str, str]:
    """`ARLOOP_<old_prefix><FIELD>` -> `ARLOOP_<SECTION>__<FIELD>` for each field."""
    return {f"{PREFIX}{old_prefix}{f}".upper(): f"{PREFIX}{section}__{f}".upper() for f in fields}


# What the learner's flat variables became when its config models nested into its settings.
RENAMED: dict[str, str] = {
    **_moved("train", "learning_rate", "full_finetune", "lora_rank", "lora_alpha"),
    **_moved("train", "micro_batch_size", "clip_eps", "kl_coef", "dpo_beta"),
    **_moved("round", "feedback_window_s", "silence_reward", "max_user_reward_share"),
    **_moved("round", "baseline", "normalise_rewards", "epochs", "train_after_tool"),
    "ARLOOP_MAX_EPISODES_PER_ROUND": "ARLOOP_ROUND__MAX_EPISODES",
    "ARLOOP_GRAD_ACCUM_STEPS": (
        "ARLOOP_ROUND__BATCH_SIZE (samples per optimiser update, formerly micro-batch size x "
        "accumulation steps; the accumulation follows from it)"
    ),
    "ARLOOP_GATE_ALPHA": "ARLOOP_GATE__ALPHA",
    "ARLOOP_GATE_SOLVED_AT": "ARLOOP_GATE__SOLVED_AT",
    "ARLOOP_OPE_MIN_ESS": "ARLOOP_GATE__MIN_ESS",
    "ARLOOP_OPE_MAX_RUNS": "ARLOOP_GATE__OPE_MAX_RUNS",
    **_moved(
        "guards",
        *("max_kl", "max_length_ratio", "min_length_ratio", "max_reward_length_corr"),
        *("min_entropy_ratio", "max_entropy_ratio", "entropy_floor", "max_eval_drop"),
        *("max_tool_use_drop", "max_clip_ratio", "max_disagreement"),
        old_prefix="guard_",
    ),
    "ARLOOP_CANARY": "ARLOOP_CANARY__ENABLED",
    **_moved(
        "canary", "alpha", "margin", "min_per_arm", "timeout_s", "check_s", old_prefix="canary_"
    ),
}


class LearnerSettings(ModelSettings, PolicyEndpointSettings):
    """`arloop learn` (and `arloop eval`, `arloop policy`): the learner process."""

    renamed: ClassVar[dict[str, str]] = RENAMED

    consumer: str = "learner-1"
    """This learner's name in the streams' consumer group (and the actor of what it publishes)."""
    min_episodes: int = Field(32, ge=1)
    """Start a round when this many trainable episodes are waiting."""
    round_interval_s: float = 600.0
    """Or when this long has passed since the last round (if any episode waits)."""
    train: TrainConfig = Field(default_factory=TrainConfig)
    """How the policy is updated: `ARLOOP_TRAIN__LEARNING_RATE`, `__LORA_RANK`, `__KL_COEF`,
    ... (learner/config.py `TrainConfig`)."""
    round: RoundConfig = Field(default_factory=RoundConfig)
    """Which episodes a round trains on and how: `ARLOOP_ROUND__FEEDBACK_WINDOW_S`,
    `__BATCH_SIZE`, `__TRAIN_AFTER_TOOL`, ... (learner/config.py `RoundConfig`)."""
    max_deliveries: int = 5
    """Deliveries after which a stream entry goes to the dead-letter stream."""
    claim_idle_ms: int = 60_000
    """Pending entries idle this long are reclaimed from a dead consumer."""
    read_count: int = 256
    """Stream entries read per XREADGROUP, per stream."""
    read_block_ms: int = 1000
    """How long a read waits for new entries when the streams are idle."""
    trim_interval_s: float = 60.0
    """How often the streams are trimmed below what every consumer group has acknowledged."""

    # -- release control: eval gate, guards, off-policy estimate, canary --------------------
    eval_packs: list[str] = Field(default_factory=list)
    """Packs whose held-out eval suites gate every new version (JSON list: '["tutoring"]';
    built-in names or `module:attr`). Empty: no gate, each round's version becomes champion."""
    tutoring_source: Literal["templates", "gsm8k", "mixed"] = "templates"
    """Problems of the tutoring pack: one-step `templates`, a `gsm8k` subset, or `mixed`."""
    tutoring_eval_size: int = Field(60, ge=1)
    """Held-out problems in the tutoring pack's eval suite."""
    eval_temperature: float = Field(0.0, ge=0.0, le=2.0)
    """Sampling temperature of eval runs; 0 (greedy) makes the paired comparison exact."""
    eval_max_tokens: int = 256
    """Completion tokens per model call in eval runs."""
    eval_concurrency: int = Field(4, ge=1)
    """Eval runs in flight at once (the policy server batches them)."""
    gate: GateConfig = Field(default_factory=GateConfig)
    """How the gate decides: `ARLOOP_GATE__ALPHA`, `__SOLVED_AT`, `__MIN_ESS`, `__OPE_MAX_RUNS`
    (learner/gate/eval_gate.py `GateConfig`)."""
    guards: GuardConfig = Field(default_factory=GuardConfig)
    """Release guard thresholds: `ARLOOP_GUARDS__MAX_KL`, `__MAX_LENGTH_RATIO`, ...
    (learner/gate/guards.py `GuardConfig`)."""
    canary: CanaryConfig = Field(default_factory=CanaryConfig)
    """The canary after a pass: `ARLOOP_CANARY__ENABLED`, `__MIN_PER_ARM`, `__MARGIN`, ...
    (learner/gate/canary.py `CanaryConfig`)."""

    def _policy_calls(self) -> dict[str, Any]:
        # eval runs pin versions and fail closed: one retry, greedy by default
        return {
            "retries": 1,
            "versioned": True,
            "temperature": self.eval_temperature,
            "max_tokens": self.eval_max_tokens,
        }
