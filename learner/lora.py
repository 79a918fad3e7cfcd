"""The trainable policy and its reference: a LoRA adapter (peft) by default, full weights as an option."""

from __future__ import annotations

import copy
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path

import torch
from peft import LoraConfig, PeftModel, get_peft_model


def attach_lora(
    model: torch.nn.Module,
    *,
    rank: int,
    alpha: int,
    dropout: float,
    targets: tuple[str, ...],
    adapter_dir: Path | None = None,
) -> PeftModel:
    """Wrap `model` with a fresh trainable adapter, or continue from the one saved in `adapter_dir`."""
    if adapter_dir is not None:
        adapter_dir = Path(adapter_dir)
        if not (adapter_dir / "adapter_config.json").exists():
            raise FileNotFoundError(
                f"no LoRA adapter in {adapter_dir} (adapter_config.json missing): pass the folder a "
                "previous PolicyTrainer.save wrote, or adapter_dir=None to start a fresh adapter"
            )
        return PeftModel.from_pretrained(model, str(adapter_dir), is_trainable=True)
    config = LoraConfig(
        r=rank,
        lora_alpha=alpha,
        lora_dropout=dropout,
        target_modules=list(targets),
        task_type="CAUSAL_LM",
    )
    return get_peft_model(model, config)


def frozen_copy(model: torch.nn.Module) -> torch.nn.Module:
    """A detached, eval-mode copy of the start weights: the reference of full fine-tuning."""
    ref = copy.deepcopy(model).eval()
    for p in ref.parameters():
        p.requires_grad_(False)
    return ref


def reference_view(
    policy: torch.nn.Module, frozen: torch.nn.Module | None
) -> tuple[torch.nn.Module, AbstractContextManager]:
    """(module to call, context to call it in) for reference log-probabilities.

    LoRA: the policy itself with its adapter disabled, i.e. the base weights (also when the
    adapter continues a parent's: the KL anchor stays the base model). Full: the frozen copy.
    """
    if frozen is not None:
        return frozen, nullcontext()
    if isinstance(policy, PeftModel):
        return policy, policy.disable_adapter()
    raise TypeError("a full fine-tune needs its frozen reference copy")
