"""The learner's own knobs, torch-free: what `LearnerSettings` nests (deploy/learn/settings.py).

`TrainConfig` is how `learner.train_step` updates the policy, `RoundConfig` which episodes
`learner.rounds` trains on and how. They live here rather than beside the code that reads
them so that the settings (and with them `arloop policy list` and the agent API, which has no
torch) import them without torch. The gate's, guards' and canary's configs live in their own
torch-free modules under `learner/gate/`.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

Baseline = Literal["rloo", "running"]


class TrainConfig(BaseModel):
    """How the policy is updated (`ARLOOP_TRAIN__<FIELD>` in the learner's settings)."""

    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)

    learning_rate: float = Field(1e-4, ge=0.0)
    """AdamW learning rate."""
    weight_decay: float = Field(0.0, ge=0.0)
    """AdamW weight decay."""
    full_finetune: bool = False
    """Train every weight instead of a LoRA adapter (needs ~3x the model's memory for Adam)."""
    lora_rank: int = Field(16, ge=1)
    """LoRA rank r."""
    lora_alpha: int = Field(32, ge=1)
    """LoRA scale numerator: the update is scaled by alpha / r."""
    lora_dropout: float = Field(0.0, ge=0.0, lt=1.0)
    """Dropout on the adapter's input; 0 keeps recomputed logprobs deterministic."""
    lora_targets: tuple[str, ...] = (
        "q_proj",
        "k_proj",
        "v_proj",
        "o_proj",
        "up_proj",
        "down_proj",
        "gate_proj",
    )
    """Module names that get an adapter (all linear layers of a Llama block); JSON list."""
    clip_eps: float = Field(0.2, gt=0.0)
    """PPO clip range: the ratio policy / proximal (the weights that first trained on a sample)
    stops pushing outside 1 ± clip_eps."""
    is_cap: float = Field(2.0, gt=0.0)
    """Cap on the importance weight proximal / behaviour that corrects for samples the serving
    policy wrote versions ago: above it a stale token's weight is cut, bounding its variance."""
    kl_coef: float = Field(0.02, ge=0.0)
    """Weight of the k3 KL penalty to the reference; 0 skips the reference forward pass."""
    entropy_coef: float = 0.0
    """Weight of the entropy bonus; 0 computes entropy for the metric only."""
    micro_batch_size: int = Field(8, ge=1)
    """Sequences per forward/backward pass; gradients accumulate over all micro-batches of a
    step, so gradient accumulation steps = ceil(len(samples) / micro_batch_size) or more
    (`micro_batch_tokens`)."""
    micro_batch_tokens: int = Field(4096, ge=1)
    """Padded tokens per forward/backward pass at most (sequences x the longest; a longer
    sequence goes alone): activation memory grows with tokens, not sequences. The triage
    agent's answers after a knowledge-base search are 650-820 tokens long, and 8 of them in
    one DPO pass took the learner to 11.8 GiB; the tutor's 8 x ~330 fit in one pass. 2048 took
    less memory still and was faster on rows with no prompt head in common, but 1.3-2x slower
    where the rows share the agent's head (each pass runs it again): `bench/bench_train_memory.py
    --caps 2048,1024`, docs: Figures."""
    max_grad_norm: float = 1.0
    """Clip the global gradient norm to this; <= 0 disables clipping (the norm is still reported)."""
    dpo_beta: float = Field(0.1, gt=0.0)
    """DPO temperature: how far the policy may move from the reference per unit of preference."""
    kto_beta: float = Field(0.1, gt=0.0)
    """KTO temperature (TRL's `beta`): how sharply a judged answer's loss saturates."""
    seed: int = 0
    """Seeds the adapter's initialisation."""


class RoundConfig(BaseModel):
    """Which episodes a round trains on and how (`ARLOOP_ROUND__<FIELD>` in the learner's settings)."""

    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)

    feedback_window_s: float = Field(600.0, ge=0.0)
    """How long a trajectory waits for feedback before it is judged on what it has."""
    silence_reward: float | None = None
    """Reward for a trajectory that got no feedback at all; None leaves it out of training."""
    max_user_reward_share: float = Field(0.2, gt=0.0, le=1.0)
    """No user's feedback may carry more than this share of a batch's reward mass."""
    baseline: Baseline = "rloo"
    """Baseline for samples with no prompt group: leave-one-out over the batch, or a running mean."""
    normalise_rewards: bool = True
    """Divide the advantages by the batch's reward std (after the group mean or baseline)."""
    max_episodes: int = Field(1024, ge=1)
    """At most this many episodes in one round (the oldest first); the rest wait for the next."""
    epochs: int = Field(1, ge=1)
    """Passes over the round's samples and pairs."""
    batch_size: int = Field(8, ge=1)
    """Samples (or pairs) per optimiser update; each update runs them in micro-batches of
    `ARLOOP_TRAIN__MICRO_BATCH_SIZE` with gradient accumulation."""
    train_after_tool: bool = True
    """Train model turns written after a tool's output with whole-run feedback. False: only
    turns before the first tool output learn from it (feedback naming a turn still trains that
    turn), for agents whose last turn reads the tool's result back."""
    subrounds: int = Field(4, ge=0)
    """Verified on-policy sub-rounds per round: labelled prompts resampled from the weights
    being trained, run through the agent's tools, checked against their label, one update
    group-relative; 0: learn from the feedback alone (no labels, no resampling). Checking is
    free once a prompt has a label: 4 sub-rounds of 8 runs learned more from the same human
    events than 2 of 4 (`bench/bench_tutoring_learning.py`, docs: Figures) for a round 2-3x as
    long (on 2 cores, 7-10 labelled prompts: 208-293 s against 91-95 s)."""
    resample_n: int = Field(8, ge=2)
    """Runs per labelled prompt in each sub-round (the group its advantages are relative to;
    more runs give a prompt the model rarely solves a success to learn from)."""
    hint_n: int = Field(0, ge=0)
    """Hinted runs a labelled prompt gets in a sub-round where none of its `resample_n` runs
    reached the label (STaR's rationalisation): the label stated in the prompt, the runs whose
    answer then came from a tool (not copied from the hint) join the group as solved, trained
    on the prompt without the hint. 0 (the default): no hints. SmolLM2-135M mostly copies a
    stated answer: on 40 tutoring prompts 15 % of hinted runs were usable (23 % copied), fewer
    than the 33 % of plain runs that solved, and 2 hinted runs rescued none of the 9 prompts no
    plain run solved, 8 rescued 1 (`bench/bench_hints.py`, docs: Figures). Measure it with
    that bench on a larger policy before turning it on."""
    max_resample_prompts: int = Field(16, ge=1)
    """Labelled prompts resampled per sub-round at most (the most confident first)."""
    resample_batch_size: int = Field(32, ge=1)
    """Runs a sub-round's resampling decodes at once (the KV cache grows with it). On 2 cores
    with SmolLM2, 32 beat 16 by 1.1-1.2x and 64 or 128 were slower; the runs were the same
    tokens at every size (`bench/bench_resample.py`, docs: Figures)."""
    restated_nll: float = Field(1.0, ge=0.0)
    """Weight of the cross-entropy on the tokens a restated pair changed (the label the pack
    wrote into the model's own reply, `learner.samples.restated_pairs`), beside its DPO loss
    (the NLL term of RPO, Pang et al. 2024, on the decision alone); 0: DPO alone."""
    label_noise: float = Field(0.05, gt=0.0, lt=0.5)
    """Share of users' judgements assumed flipped: how much one thumbs-up says (0.05: 95 %)."""
    label_threshold: float = Field(0.9, gt=0.5, lt=1.0)
    """Confidence the votes must give an answer before it labels its prompt."""
    kto_judgements: bool = True
    """A served run judged only by thumbs or ratings and alone for its prompt trains by KTO
    (desirable above 0, undesirable below) rather than by policy gradient, whose baseline
    would then compare it with other prompts; false: policy gradient for those too."""
    reward_model_heads: int = Field(8, ge=0)
    """Heads of the reward-model ensemble fitted each round on the store's judged runs, to
    score runs nobody judged (`learner/reward_model.py`); 0: no reward model."""
    reward_model_k: float = Field(1.0, ge=0.0)
    """Pessimism: a silent run trains on the heads' mean score minus k times their spread."""
    reward_model_min_runs: int = Field(64, ge=4)
    """Judged runs (a non-neutral judgement, logged token ids) needed before a fit. Fewer make
    its held-out check weak: a model whose scores say nothing passes it about 7 % of the time
    at 64 runs, 11 % at 48 (`tests/learner/test_reward_model.py` simulates it), so a first
    round of fewer judged runs lets its silent runs go rather than score them."""
    reward_model_min_auroc: float = Field(0.75, ge=0.5, le=1.0)
    """Held-out AUROC a fit must reach before its scores train anything; below it silent
    runs are let go as without a reward model."""
    recompute_behaviour: bool = True
    """Recompute the behaviour logprobs of trained steps that a quantised engine served (the
    policy server on a llama.cpp `q8_0` export), with the fp32 weights of the version that
    served them (one extra forward pass over those steps); the gap replaced is the metric
    `behaviour/engine_gap`. False: train against the logged values."""
