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

import hashlib
import hmac
import logging
from pathlib import Path
from typing import Any, ClassVar, Literal
from urllib.parse import unquote, urlsplit

from pydantic import (
    AliasChoices,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_core import InitErrorDetails, PydanticCustomError
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from agents.events import MAX_STREAM_SHARDS, StreamShards
from agents.feedback_tokens import MAX_TOKEN_TTL_S
from agents.model_routes import Endpoint, ModelRoute, Provider
from agents.policy_client import PolicyConfig
from deploy import redis_conn
from deploy.credentials import (
    HOW_TO_MAKE_ONE,
    KEY_MIN_BITS,
    KEY_MIN_CHARS,
    SECRET_MIN_BITS,
    SECRET_MIN_CHARS,
    ApiKey,
    Identity,
    key_weakness,
    placeholder,
    plain_key,
    plain_keys,
    weakness,
)

DEV_SECRET = "arloop-development-secret-do-not-use-in-production"
DEV_API_KEY = "dev-key"
PREFIX = "ARLOOP_"
EVERY_INTERFACE = ("0.0.0.0", "::", "[::]")
log = logging.getLogger("arloop.settings")


# -- per-process listening address (issue 17) ----------------------------------------------
def process_var(process: str, name: str) -> Any:
    """`ARLOOP_<PROCESS>_<NAME>`, else the shared `ARLOOP_<NAME>` (read before each process had
    its own): one `.env` can hold the agent API's and the policy server's ports."""
    own = f"{PREFIX}{process}_{name}".upper()
    return AliasChoices(own, f"{PREFIX}{name}".upper())


# -- end per-process listening address ----------------------------------------------------


class CommonSettings(BaseSettings):
    """What every arloop process shares."""

    model_config = SettingsConfigDict(
        env_prefix=PREFIX,
        env_file=".env",
        extra="ignore",
        populate_by_name=True,  # `AgentApiSettings(port=...)` as well as ARLOOP_AGENTS_PORT
        env_nested_delimiter="__",
        use_attribute_docstrings=True,
    )
    renamed: ClassVar[dict[str, str]] = {}
    """Old variable -> what to set instead; setting an old one is an error naming the new."""

    env: Literal["development", "production"] = "development"
    """`production` refuses default or weak secrets and keys, and a Redis without credentials."""
    redis_url: str | None = None
    """Redis to use: `redis://[user:password@]host:6379/0`, or `rediss://...` for TLS; unset
    starts (or reuses) the embedded server under `data_dir/redis` (development only)."""
    redis_username: str | None = None
    """Redis ACL user of this process (else the URL's, else `default`): give each process its
    own (`deploy/manifests/redis-acl.conf`)."""
    redis_password: SecretStr | None = None
    """Password of the Redis user (else the URL's)."""
    redis_ca_cert: Path | None = None
    """CA certificate to check a `rediss://` server against (unset: the system's)."""
    redis_health_check_s: float = Field(5.0, ge=0.0)
    """A pooled Redis connection idle this long is PINGed before it is used (0: never)."""
    redis_retries: int = Field(3, ge=0)
    """Retries of a Redis command after a connection error or timeout (a restart, a failover),
    on a fresh connection, with exponential backoff."""
    redis_cluster: bool = False
    """`ARLOOP_REDIS_URL` is a node of a Redis Cluster (any node): every client is redis-py's
    cluster client (docs/deploying.md, "Redis Cluster"); needs a `redis://` URL, no embedded
    server."""
    stream_shards: int = Field(1, ge=1, le=MAX_STREAM_SHARDS)
    """Shards of the trajectory and feedback streams: a run and its feedback go to the shard a
    hash of its trajectory id picks, and the learner reads them all. More than 1 spreads the
    feedback intake over a Redis Cluster's masters (docs/deploying.md, "Sharded streams"). Every
    process must use the same count: the first to start records it in Redis, and a process with
    another count is refused."""
    data_dir: Path = Path(".arloop")
    """Where the embedded Redis, the learner's store, checkpoints and reports live."""
    log_level: str = "INFO"
    """Python logging level of the process (DEBUG, INFO, WARNING, ...)."""
    log_format: Literal["json", "text"] = "json"
    """Log lines as JSON objects (`json`, for collectors) or plain `text` for people."""
    otlp_endpoint: str | None = None
    """OTLP/HTTP traces endpoint (e.g. `http://127.0.0.1:4318/v1/traces`): spans around graph
    nodes, tool and model calls go there (needs `arloop[otel]`); unset: none are exported."""

    @model_validator(mode="after")
    def _redis_url_fits_the_mode(self) -> CommonSettings:
        if self.redis_cluster and not self.redis_url:
            raise ValueError(
                "ARLOOP_REDIS_CLUSTER=true needs ARLOOP_REDIS_URL, a node of the cluster "
                "(redis://host:port): the embedded Redis is not a cluster"
            )
        why = redis_conn.check_url(self.redis_url or "", self.redis_cluster)
        if why:
            raise ValueError(why)
        return self

    @model_validator(mode="after")
    def _nothing_weak_in_production(self) -> CommonSettings:
        """Every production problem at once, one line each (`production_problems`)."""
        if self.env != "production":
            return self
        problems = self.production_problems()
        if problems:
            raise ValueError("\n".join(problems))
        host = getattr(self, "host", None)
        if host in EVERY_INTERFACE:
            log.warning(
                "listening on every interface (%s) in production: keep the port behind a "
                "TLS-terminating gateway or firewall, or set ARLOOP_AGENTS_HOST / ARLOOP_POLICY_HOST to "
                "one interface",
                host,
            )
        return self

    def production_problems(self) -> list[str]:
        """What production refuses in these settings, each with its fix (each process's class
        adds its own)."""
        if not self.redis_url:
            return [
                "ARLOOP_REDIS_URL must be set in production: the embedded Redis has no password. "
                "Set it to a Redis with an ACL user and password, e.g. "
                "ARLOOP_REDIS_URL=rediss://arloop-agents:<password>@redis.internal:6379/0"
            ]
        if not (urlsplit(self.redis_url).password or self.redis_password):
            return [
                "ARLOOP_REDIS_URL has no credentials: in production any process that reaches "
                "that Redis could move the champion alias. Give it a user and password "
                "(redis://<user>:<password>@host:6379/0, or ARLOOP_REDIS_USERNAME and "
                "ARLOOP_REDIS_PASSWORD); deploy/manifests/redis-acl.conf has one user per process"
            ]
        password = self.redis_password or SecretStr(
            unquote(urlsplit(self.redis_url).password or "")
        )
        why = key_weakness(password.get_secret_value())
        if why:
            return [
                f"the Redis password (ARLOOP_REDIS_PASSWORD, else ARLOOP_REDIS_URL's) is too weak "
                f"for production ({why}): give the process's Redis user a random one, e.g. "
                f"`{HOW_TO_MAKE_ONE}`"
            ]
        return []

    @property
    def shards(self) -> StreamShards:
        """The streams' shard layout (`stream_shards`)."""
        return StreamShards(self.stream_shards)

    def redis_options(self, url: str, *, asyncio: bool = False) -> dict[str, Any]:
        """redis-py client arguments: credentials, TLS, health checks, retries (`asyncio`:
        for a `redis.asyncio` client)."""
        return redis_conn.options(self, url, asyncio=asyncio)

    def redis_client(self, url: str, **extra: Any) -> Any:
        """A blocking Redis client for `url` (a cluster client with `redis_cluster`)."""
        return redis_conn.sync_client(url, self, **extra)

    def async_redis(self, url: str, **extra: Any) -> Any:
        """An asyncio Redis client for `url` (a cluster client with `redis_cluster`)."""
        return redis_conn.async_client(url, self, **extra)

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
    arloop's own policy server: they pin versions, `arloop@v3`); empty: the provider's own
    address (`anthropic/...`, `openai/gpt-4o-mini`)."""
    policy_model: str = "openai/arloop"
    """Any litellm model string; `openai/<name>` for an OpenAI-compatible endpoint."""
    policy_api_key: str = "none"
    """API key sent to the policy endpoint (arloop's policy server checks it against its
    `ARLOOP_POLICY_KEYS` when that is set; the learner's must be the gate's key there).
    Production refuses the manifests' development placeholder (`arloop-development-...`)."""
    policy_timeout_s: float = Field(60.0, gt=0.0)
    """Seconds one model call may take before it fails (504 on the agent API)."""
    policy_temperature: float | None = None
    """Sampling temperature the agents send to the policy; unset leaves the endpoint's default
    (1.0 on arloop's policy server). The learner's sub-rounds resample at it."""
    policy_max_tokens: int | None = 512
    """Completion tokens per model call of the agents (and of the learner's resampling)."""
    policy_provider: Provider = "auto"
    """What the policy endpoint supports: `arloop` (our policy server: versions, token ids,
    logprobs), `vllm` (token ids, logprobs), `other` (any other provider: plain requests, runs
    not trainable), or `auto`: `openai/arloop` is ours, `hosted_vllm/...` vLLM, else other."""

    def production_problems(self) -> list[str]:
        out = super().production_problems()
        why = placeholder(self.policy_api_key)
        if why:
            out.append(
                f"ARLOOP_POLICY_API_KEY is {why}: replace it with this process's key in the "
                f"policy server's ARLOOP_POLICY_KEYS, a random one, e.g. `{HOW_TO_MAKE_ONE}`"
            )
        return out

    def policy_config(self) -> PolicyConfig:
        """The policy client's configuration: this endpoint, called as this process calls it."""
        return PolicyConfig(
            model=self.policy_model,
            api_base=self.policy_api_base or None,  # empty: the provider's own address
            api_key=self.policy_api_key,
            timeout_s=self.policy_timeout_s,
            provider=self.policy_provider,
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

    host: str = Field("127.0.0.1", validation_alias=process_var("agents", "host"))
    """Interface the agent API listens on: `ARLOOP_AGENTS_HOST` (else `ARLOOP_HOST`), or
    `arloop serve agents --host`."""
    port: int = Field(8000, ge=0, le=65535, validation_alias=process_var("agents", "port"))
    """Port the agent API listens on: `ARLOOP_AGENTS_PORT` (else `ARLOOP_PORT`), or
    `arloop serve agents --port`."""
    api_keys: list[ApiKey] = Field(default_factory=lambda: [ApiKey(**plain_key(DEV_API_KEY))])
    """Client credentials, a JSON list: a bare key string (any user_id), or an object binding
    the key to a tenant and an identity, e.g. `{"key": "...", "name": "web", "tenant": "acme",
    "identity": "signed"}` (see `deploy/credentials.py`)."""
    secret_key: str = DEV_SECRET
    """Seals feedback tokens (AES-256-GCM, key derived by HKDF). Must be set outside
    development."""
    user_id_key: SecretStr | None = None
    """Keys the hash that stands for each user id wherever arloop stores or hands one out (Redis
    key names, streams, exports, feedback tokens: `deploy.credentials.pseudonym`); unset: derived
    from ARLOOP_SECRET_KEY. Set it before rotating ARLOOP_SECRET_KEY, to the key in use, or every
    user's threads, memories and rate windows start over."""
    user_token_secret: SecretStr | None = None
    """Checks the `X-Arloop-User` tokens of keys with identity `signed` (HMAC-SHA256)."""
    user_header: str = "X-Forwarded-User"
    """The gateway's header that names the user, for keys with identity `header`."""
    key_rate_per_minute: int = Field(1200, ge=1)
    """Runs (and, counted apart, feedback) one API key may send per minute, all its users
    together, unless the key sets its own `rate_per_minute`."""
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
    feedback_token_ttl_s: int = Field(24 * 3600, ge=60, le=MAX_TOKEN_TTL_S)
    """How long a run's feedback token stays valid (at most 400 days): a day by default, for the
    people who rate a run while they remember it; raise it for late outcomes (a test result)."""
    feedback_scores_per_run: int = Field(8, ge=0, le=64)
    """Named scores (`kind: score`, each `key` once) one run's token may give; 409 beyond."""
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
    memory_ttl_s: int | None = Field(180 * 24 * 3600, ge=60)
    """A user's long-term memory (per task kind and kind) expires this long after its last
    write; unset keeps it until the user is erased (`arloop forget`)."""
    stream_max_entries: int | None = Field(200_000, ge=1000)
    """Runs (and, apart, feedback) the streams keep (XADD MAXLEN ~): the learner trims what it
    has read, so this bounds Redis when the learner stops. Past it the oldest entries go,
    read or not: the learner counts those it never read (`trimmed_unread` on the dashboard,
    `arloop_learner_trimmed_unread` on its /metrics). With sharded streams each shard keeps
    its share (this divided by `ARLOOP_STREAM_SHARDS`). Unset: unbounded."""
    run_idle_s: float = Field(600.0, gt=0.0)
    """A run of `/v1/chat/completions` calls (one `X-Arloop-Run`) that is not ended with
    `POST /v1/runs/{trajectory_id}/end` is closed and logged this long after its last call
    (its output: the last call's answer)."""
    chat_scrub_prompts: bool = True
    """With ARLOOP_SCRUB_PHI: a `/v1/chat/completions` call's messages are scrubbed before the
    policy reads them, as the built-in packs scrub a user's message (`input_filter`): the
    model never reads a name or a phone number, and the stored prompt's token ids are those of
    its scrubbed text, so the run is trained on. Off: the policy reads the messages as sent,
    and a run whose prompt held PHI is kept as text only (its token ids no longer match what
    is stored), never trained on."""
    chat_tokens_per_minute: int = Field(200_000, ge=1)
    """Completion tokens one API key may ask for a minute on `/v1/chat/completions` (`n` times
    `max_tokens`, else ARLOOP_POLICY_MAX_TOKENS, reserved when a call starts), all its users
    together; 429 past it."""
    redis_timeout_s: float = 5.0
    """Socket timeout for Redis; a Redis that does not answer in time is a 503."""
    # -- models per agent and fallbacks (agents/model_routes.py) --
    policy_fallbacks: list[Endpoint] = Field(default_factory=list)
    """Endpoints tried in turn when the policy endpoint fails after its retries (litellm's
    Router), a JSON list: `[{"model": "openai/gpt-4o-mini", "api_base": "...", "api_key":
    "..."}]`; a run another provider answered is logged without token ids (not trainable)."""
    agent_models: dict[str, ModelRoute] = Field(default_factory=dict)
    """Per agent, its own model over its pack's (`AgentSpec.model`) and the process's, a JSON
    object: `{"triage": {"model": "anthropic/claude-3-5-haiku-latest", "fallbacks":
    [{"model": "openai/arloop", "api_base": "http://127.0.0.1:8001/v1"}]}}`."""

    def pseudonym_key(self) -> bytes:
        """The key of `deploy.credentials.pseudonym`: ARLOOP_USER_ID_KEY, else one derived from
        ARLOOP_SECRET_KEY (so that a leaked pseudonym key does not open feedback tokens)."""
        if self.user_id_key is not None:
            return self.user_id_key.get_secret_value().encode()
        return hmac.new(self.secret_key.encode(), b"arloop user ids", hashlib.sha256).digest()

    def _policy_calls(self) -> dict[str, Any]:
        return {
            "retries": self.policy_retries,
            "versioned": self.policy_versioned,
            "temperature": self.policy_temperature,
            "max_tokens": self.policy_max_tokens,
            "fallbacks": tuple(self.policy_fallbacks),
        }

    @field_validator("api_keys", mode="before")
    @classmethod
    def _bare_keys(cls, value: Any) -> Any:
        return plain_keys(value)

    @model_validator(mode="after")
    def _signed_keys_need_a_secret(self) -> AgentApiSettings:
        if any(k.identity is Identity.SIGNED for k in self.api_keys) and not self.user_token_secret:
            raise ValueError(
                "an API key has identity 'signed' but ARLOOP_USER_TOKEN_SECRET is unset: set it "
                f"to the secret your app signs user tokens with (`{HOW_TO_MAKE_ONE}`)"
            )
        return self

    def production_problems(self) -> list[str]:
        out = super().production_problems()
        why = weakness(self.secret_key, SECRET_MIN_CHARS, SECRET_MIN_BITS)
        if self.secret_key == DEV_SECRET or why:
            out.append(
                f"ARLOOP_SECRET_KEY is too weak for production ({why or 'the development value'})"
                f": set it to a random string, e.g. `{HOW_TO_MAKE_ONE}`"
            )
        if not self.api_keys:
            out.append("ARLOOP_API_KEYS is empty: give each client its own key")
        for k in self.api_keys:
            secret = k.key.get_secret_value()
            why = "the development key" if secret == DEV_API_KEY else None
            why = why or weakness(secret, KEY_MIN_CHARS, KEY_MIN_BITS)
            if why:
                out.append(
                    f"API key {k.name!r} is too weak for production ({why}): replace it in "
                    f"ARLOOP_API_KEYS with a random one, e.g. `{HOW_TO_MAKE_ONE}`"
                )
        for name, value in (
            ("ARLOOP_USER_TOKEN_SECRET", self.user_token_secret),
            ("ARLOOP_USER_ID_KEY", self.user_id_key),
        ):
            why = value and weakness(value.get_secret_value(), SECRET_MIN_CHARS, SECRET_MIN_BITS)
            if why:
                out.append(f"{name} is too weak ({why}): `{HOW_TO_MAKE_ONE}`")
        return out
