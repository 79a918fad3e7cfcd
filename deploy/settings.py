"""One settings class per process, read from `ARLOOP_*` environment variables and `.env`."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

DEV_SECRET = "arloop-development-secret-do-not-use-in-production"


class CommonSettings(BaseSettings):
    """What every arloop process shares."""

    model_config = SettingsConfigDict(env_prefix="ARLOOP_", env_file=".env", extra="ignore")

    env: Literal["development", "production"] = "development"
    """`production` refuses default secrets and open API keys."""
    redis_url: str | None = None
    """Redis to use; unset starts (or reuses) the embedded server under `data_dir/redis`."""
    data_dir: Path = Path(".arloop")
    """Where the embedded Redis, the learner's store, checkpoints and reports live."""
    log_level: str = "INFO"
    log_format: Literal["json", "text"] = "json"
    """Log lines as JSON objects (`json`, for collectors) or plain `text` for people."""


class AgentApiSettings(CommonSettings):
    """`arloop serve agents`: the agent API."""

    host: str = "127.0.0.1"
    port: int = 8000
    api_keys: list[str] = Field(default_factory=lambda: ["dev-key"])
    """Bearer keys clients must send; JSON list in the environment: '["k1","k2"]'."""
    secret_key: str = DEV_SECRET
    """Signs feedback tokens (HMAC-SHA256). Must be set outside development."""
    policy_api_base: str = "http://127.0.0.1:8001/v1"
    """OpenAI-compatible endpoint the agents call through litellm."""
    policy_model: str = "openai/arloop"
    """Any litellm model string; `openai/<name>` for an OpenAI-compatible endpoint."""
    policy_api_key: str = "none"
    policy_versioned: bool = True
    """Route by policy version (`<model>@champion`, `@candidate`): needs arloop's policy server."""
    policy_timeout_s: float = 60.0
    policy_retries: int = 2
    canary_share: float = Field(0.10, ge=0.0, le=1.0)
    """Share of new threads sent to the `candidate` version while one exists."""
    max_input_chars: int = 8000
    feedback_token_ttl_s: int = 7 * 24 * 3600
    feedback_rate_per_minute: int = 60
    """Feedback events one user may send per minute before 429."""
    run_rate_per_minute: int = 120
    """Runs one user may start per minute before 429."""
    packs: list[str] = Field(default_factory=lambda: ["tutoring", "medical"])
    """Agent packs to serve."""
    policy_temperature: float | None = None
    """Sampling temperature sent to the policy; unset leaves the endpoint's default."""
    policy_max_tokens: int | None = 512
    """Completion tokens per model call."""
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

    @model_validator(mode="after")
    def _no_default_secrets_in_production(self) -> AgentApiSettings:
        if self.env == "production":
            if self.secret_key == DEV_SECRET or len(self.secret_key) < 32:
                raise ValueError(
                    "ARLOOP_SECRET_KEY must be set to a random string of 32+ characters in "
                    "production (e.g. `python -c 'import secrets; print(secrets.token_hex(32))'`)"
                )
            if "dev-key" in self.api_keys:
                raise ValueError("ARLOOP_API_KEYS still holds the development key 'dev-key'")
        return self


class PolicyServerSettings(CommonSettings):
    """`arloop serve policy`: the embedded OpenAI-compatible policy server."""

    host: str = "127.0.0.1"
    port: int = 8001
    base_model: str = "smollm2"
    """`smollm2` (bundled SmolLM2-135M-Instruct), a Hugging Face id or path, or `tiny` (tests)."""
    served_name: str = "arloop"
    """The model name clients use: `arloop`, `arloop@champion`, `arloop@v3`."""
    max_tokens_cap: int = 1024
    max_batch_size: int = 8
    batch_window_ms: float = 5.0
    """How long the batcher waits for more requests before a forward pass."""
    reload_poll_s: float = 5.0
    """Registry check interval, besides pub/sub notifications."""
    device: str = "cpu"
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


class LearnerSettings(CommonSettings):
    """`arloop learn`: the learner process."""

    base_model: str = "smollm2"
    consumer: str = "learner-1"
    feedback_window_s: float = 600.0
    """How long a trajectory waits for feedback before it is judged on what it has."""
    silence_reward: float | None = None
    """Reward for a trajectory that got no feedback at all; None leaves it out of training."""
    train_after_tool: bool = True
    """Train model turns written after a tool's output with whole-run feedback. False: only
    turns before the first tool output learn from it (feedback naming a turn still trains that
    turn), for agents whose last turn reads the tool's result back."""
    min_episodes: int = 32
    """Start a round when this many trainable episodes are waiting."""
    round_interval_s: float = 600.0
    """Or when this long has passed since the last round (if any episode waits)."""
    full_finetune: bool = False
    learning_rate: float = 1e-4
    lora_rank: int = 16
    lora_alpha: int = 32
    micro_batch_size: int = 8
    grad_accum_steps: int = 1
    epochs: int = 1
    clip_eps: float = 0.2
    kl_coef: float = 0.02
    max_user_reward_share: float = Field(0.2, gt=0.0, le=1.0)
    """No user's feedback may carry more than this share of a batch's reward mass."""
    max_deliveries: int = 5
    """Deliveries after which a stream entry goes to the dead-letter stream."""
    claim_idle_ms: int = 60_000
    """Pending entries idle this long are reclaimed from a dead consumer."""
    baseline: Literal["rloo", "running"] = "rloo"
    """Baseline for samples with no prompt group: leave-one-out over the batch, or a running mean."""
    normalise_rewards: bool = True
    """Divide a round's rewards by their standard deviation before the advantages."""
    dpo_beta: float = 0.1
    """DPO temperature for correction pairs."""
    max_episodes_per_round: int = 1024
    """At most this many episodes in one round (the oldest first); the rest wait for the next."""
    read_count: int = 256
    """Stream entries read per XREADGROUP, per stream."""
    read_block_ms: int = 1000
    """How long a read waits for new entries when the streams are idle."""
    trim_interval_s: float = 60.0
    """How often the streams are trimmed below what every consumer group has acknowledged."""

    # -- release control: eval gate, guards, off-policy estimate, canary --------------------
    eval_packs: list[str] = Field(default_factory=list)
    """Packs whose held-out eval suites gate every new version (JSON list: '["tutoring"]').
    Empty: no gate is configured and each round's version becomes champion directly."""
    policy_api_base: str = "http://127.0.0.1:8001/v1"
    """The policy server the gate's eval runs call (arloop's own: versions are pinned `@vN`)."""
    policy_model: str = "openai/arloop"
    policy_api_key: str = "none"
    policy_timeout_s: float = 60.0
    eval_temperature: float = Field(0.0, ge=0.0, le=2.0)
    """Sampling temperature of eval runs; 0 (greedy) makes the paired comparison exact."""
    eval_max_tokens: int = 256
    """Completion tokens per model call in eval runs."""
    eval_concurrency: int = Field(4, ge=1)
    """Eval runs in flight at once (the policy server batches them)."""
    gate_alpha: float = Field(0.05, gt=0.0, lt=1.0)
    """Level of the one-sided McNemar test "candidate worse than champion" on the eval suite."""
    gate_solved_at: float = Field(1.0, ge=0.0, le=1.0)
    """A task is solved when the pack's verifier scores it at least this."""
    guard_max_kl: float = 0.5
    """Per-token KL(candidate || base) budget in nats on the candidate's eval completions."""
    guard_max_length_ratio: float = 1.5
    guard_min_length_ratio: float = 0.5
    """Bounds on candidate / champion mean final-answer length on the eval suite."""
    guard_max_reward_length_corr: float = 0.5
    """Most correlation of training reward with answer length in the candidate's batch."""
    guard_min_entropy_ratio: float = 0.5
    """Least candidate / base mean token entropy on the candidate's eval completions."""
    guard_max_entropy_ratio: float = 2.0
    """Most of the same ratio: an oversized update scrambles the policy (entropy blows up)."""
    guard_entropy_floor: float = 0.0
    """Absolute floor on the candidate's mean token entropy, nats (0: off)."""
    guard_max_eval_drop: float = 0.05
    """Goodhart: most held-out success drop while the training reward went up."""
    guard_max_tool_use_drop: float = 0.10
    """Most drop in the rate of using the needed tool on eval tasks that need one."""
    guard_max_clip_ratio: float = 0.2
    """Most share of clipped tokens in the candidate's round."""
    guard_max_disagreement: float = 0.25
    """Most disagreement between two reward sources scoring the same runs (0..1)."""
    ope_min_ess: float = 30.0
    """The off-policy estimate refuses to conclude below this effective sample size."""
    ope_max_runs: int = 512
    """Most recent logged runs (not trained on by the candidate) the estimate reads."""
    canary: bool = True
    """After a pass, the version becomes `candidate` and serves the agent side's canary share;
    false promotes it to champion at once."""
    canary_alpha: float = Field(0.05, gt=0.0, lt=1.0)
    canary_margin: float = 0.1
    """Promote when live reward is, with confidence, no worse than the champion's by this."""
    canary_min_per_arm: int = 30
    """Runs with feedback each arm needs before a promotion."""
    canary_timeout_s: float = 24 * 3600.0
    """An undecided canary is rolled back after this long."""
    canary_check_s: float = 10.0
    """How often the learner checks the canary."""
