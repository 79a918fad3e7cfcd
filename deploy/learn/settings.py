"""`arloop learn`'s settings (also read by `arloop eval` and `arloop policy`): the learner's
config models nested as `ARLOOP_TRAIN__*`, `ARLOOP_ROUND__*`, `ARLOOP_GATE__*`,
`ARLOOP_GUARDS__*`, `ARLOOP_CANARY__*`. Apart from the serving processes' settings
(`deploy/settings.py`), so the agent API and the policy server never import the learner."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field

from deploy.settings import PREFIX, ModelSettings, PolicyEndpointSettings
from learner.config import RoundConfig, TrainConfig
from learner.gate.canary import CanaryConfig
from learner.gate.eval_gate import GateConfig
from learner.gate.guards import GuardConfig


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
    lease_s: float = Field(30.0, ge=2.0)
    """How long the learner's lease lasts unrenewed (it renews every third): one learner at a
    time; another waits, and takes over this long after the holder stopped renewing."""
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
    metrics_host: str = "127.0.0.1"
    """Interface of the learner's `/metrics` and `/healthz`."""
    metrics_port: int = Field(8002, ge=0, le=65535)
    """Port of the learner's `/metrics` (Prometheus) and `/healthz`; 0: not served. Taken by
    another process: the learner runs on and says so (`--once` never serves them)."""
    report_to: list[Literal["tensorboard"]] = Field(default_factory=list)
    """Experiment trackers that get each round's metrics, a JSON list: '["tensorboard"]' writes
    event files under `data_dir/tensorboard` (needs `pip install 'arloop[tensorboard]'`); empty:
    none (the learner's /metrics and its round line are always there)."""
    checkpoint_uri: str | None = Field(None, pattern=r"^s3://[^/]+(/.*)?$")
    """Object storage for the checkpoints, `s3://bucket/prefix`: each version's folder is
    uploaded to `<prefix>/<version>` before it is published, and the registry records that URI
    with the folder's digest, which every server checks after fetching it. Endpoint and
    credentials the AWS way (`AWS_ENDPOINT_URL`, `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`,
    `AWS_DEFAULT_REGION`, or a role). Unset: the registry names the folder under `data_dir`,
    which the policy servers must see (a shared volume)."""
    status_interval_s: float = Field(2.0, gt=0.0)
    """How often the stream figures are refreshed (gauges, and the status the dashboard reads)."""
    collective_timeout_s: float = Field(300.0, ge=5.0)
    """Under `accelerate launch` (or torchrun): how long a rank waits in a collective (a
    batch's gradient all-reduce, rank 0's next command) before it gives up on a silent peer
    and exits; a killed peer is noticed at once. Rank 0 sends a heartbeat every fifth of it,
    so the other ranks wait between rounds; keep it above the slowest training step."""

    # -- release control: eval gate, guards, off-policy estimate, canary --------------------
    eval_gate: bool = True
    """Gate every new version on held-out eval suites before it serves; `false` turns the gate
    off: each round's version then becomes champion directly."""
    eval_packs: list[str] | None = None
    """Packs whose held-out eval suites gate every new version (JSON list: '["tutoring"]';
    built-in names or `module:attr`); unset: every installed pack that has an eval suite.
    '[]' turns the gate off, as ARLOOP_EVAL_GATE=false does."""
    label_packs: list[str] | None = None
    """Packs whose agents' feedback becomes labels and verified sub-rounds (their answers are
    read, their runs replayed through their tools); unset: the eval packs. '[]': none."""
    tutoring_source: Literal["templates", "gsm8k", "mixed"] = "templates"
    """Problems of the tutoring pack: one-step `templates`, a `gsm8k` subset, or `mixed`."""
    tutoring_eval_size: int = Field(480, ge=1)
    """Held-out problems in the tutoring pack's eval pool (the gate draws from it)."""
    eval_temperature: float | None = Field(None, ge=0.0, le=2.0)
    """Sampling temperature of the gate's sampled runs; unset: the agents' own (see
    `serving_temperature`); 0: greedy, one run a task."""
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

    def gate_packs(self) -> list[str]:
        """The packs that gate each version: none with the gate off, else `eval_packs`, else
        every pack registered under `arloop.packs` that has an eval suite (`Pack.has_eval_suite`)."""
        if not self.eval_gate:
            return []
        if self.eval_packs is not None:
            return list(self.eval_packs)
        from agents.packs import get_pack, registered  # built lazily: the packs cost a second

        size, source = self.tutoring_eval_size, self.tutoring_source
        return [
            name
            for name in sorted(registered())
            if get_pack(name, tutoring_source=source, tutoring_eval_size=size).has_eval_suite()
        ]

    def serving_temperature(self) -> float:
        """How the agents sample: ARLOOP_POLICY_TEMPERATURE, else the policy server's 1.0."""
        return 1.0 if self.policy_temperature is None else self.policy_temperature

    def sampling_temperature(self) -> float:
        """The gate's sampled runs: `eval_temperature`, else what users get."""
        return (
            self.serving_temperature() if self.eval_temperature is None else self.eval_temperature
        )

    def _policy_calls(self) -> dict[str, Any]:
        # eval runs pin versions and fail closed: one retry; each run sets its temperature
        return {
            "retries": 1,
            "versioned": True,
            "temperature": 0.0,
            "max_tokens": self.eval_max_tokens,
        }
