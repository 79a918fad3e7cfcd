"""TRL's GRPOTrainer set up as arloop's own update runs, for the benchmarks that race the two.

One place for the settings both TRL arms share, so they cannot drift apart: the DAPO loss
(token-level, as `learner.losses`), no bias-corrected KL, fp32 on the CPU, no dropout, a
constant learning rate, nothing saved or reported. Each bench passes what its run decides
(batches, steps, learning rate, KL weight, seed).
"""

from __future__ import annotations

import tempfile
from typing import Any

from learner.train_step import TrainConfig


def grpo_args(train: TrainConfig, **run: Any):
    """`GRPOConfig` with the shared settings; `run`: the bench's own (they win)."""
    from trl import GRPOConfig

    shared = dict(
        output_dir=tempfile.mkdtemp(prefix="arloop-trl-"),
        lr_scheduler_type="constant",
        max_grad_norm=train.max_grad_norm,
        epsilon=train.clip_eps,
        loss_type="dapo",
        use_bias_correction_kl=False,
        bf16=False,
        gradient_checkpointing=False,
        use_cpu=True,
        report_to="none",
        logging_steps=1,
        save_strategy="no",
        disable_dropout=True,
        optim="adamw_torch",
        dataloader_num_workers=0,
        disable_tqdm=True,
    )
    return GRPOConfig(**(shared | run))


def lora_config(train: TrainConfig):
    """The adapter arloop trains (rank, alpha, targets), as peft's `LoraConfig` without dropout."""
    from peft import LoraConfig

    return LoraConfig(
        r=train.lora_rank,
        lora_alpha=train.lora_alpha,
        lora_dropout=0.0,
        target_modules=list(train.lora_targets),
        task_type="CAUSAL_LM",
    )
