"""One optimiser update of the policy from logged samples: decoupled PPO (RL), DPO or KTO.

Current log-probabilities are recomputed on the logged token ids; the loss math is in
`learner.losses`. The PPO clip is against a sample's proximal logprobs, those of its first
update in this trainer (stored on the Sample, so later epochs clip against them), and the
logged behaviour logprobs only weight the advantage. LoRA through peft by default (reference
= adapter disabled), full fine-tuning as an option (reference = a frozen copy of the start
weights). `save` writes AdamW's state beside the weights, and a trainer continuing them loads
it, so Adam's moments carry over from round to round.

Multi-GPU: the same code runs under `accelerate launch` (DDP). `accelerate.Accelerator`
places the model, wraps it for DDP, autocasts and runs backward; every process is given the
same sample list and trains on its shard `samples[rank::world]`, the token count that
normalises the loss is summed over processes, gradients are synchronised only on the last
micro-batch (`accelerator.no_sync`), and metric sums are reduced over processes. Nothing is
home-made: on one CPU or GPU it is a plain loop.
"""

from __future__ import annotations

import logging
import math
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path

import torch
from accelerate import Accelerator

from learner.config import TrainConfig
from learner.heap import trim_heap
from learner.logprobs import TokenBatch, make_batch, selected_logprobs
from learner.lora import attach_lora, frozen_copy, reference_view
from learner.losses import clipped_pg_loss, dpo_loss, kto_loss, kto_reference_point
from learner.samples import Judged, PreferencePair, Sample
from learner.step_inputs import (
    check_judged,
    check_pairs,
    check_samples,
    flat_advantages,
    flat_behaviour,
    flat_proximal,
    loss_mask,
    micro_batches,
    token_chunks,
)
from learner.step_metrics import TOKEN_MEANS, add_corr_sums, pg_metrics

log = logging.getLogger(__name__)

OPTIMIZER_FILE = "optimizer.pt"
"""AdamW's state, beside the weights `PolicyTrainer.save` writes."""


class PolicyTrainer:
    """Holds the trainable policy, its reference and the optimiser; one `step` = one update."""

    def __init__(
        self,
        model: torch.nn.Module,
        pad_id: int,
        config: TrainConfig,
        adapter_dir: Path | None = None,
        optimizer_state: Path | None = None,
    ) -> None:
        """`adapter_dir` continues a saved LoRA adapter (and its optimizer.pt, when there);
        `optimizer_state` names an AdamW state to continue explicitly (full fine-tuning)."""
        self.config = config
        self.pad_id = pad_id
        self.accelerator = Accelerator()
        self._copies = 1  # how many times `_shard` took each item of the current step
        self._frozen_ref = None
        if config.full_finetune:
            if adapter_dir is not None:
                raise ValueError(
                    "adapter_dir continues a LoRA adapter; "
                    "for full fine-tuning load the parent's weights as `model` "
                    "(and its optimizer.pt as `optimizer_state`)"
                )
            self._frozen_ref = frozen_copy(model).to(self.accelerator.device)
            policy = model.requires_grad_(True)
        else:
            # seed the adapter without touching the caller's RNG
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(config.seed)
                policy = attach_lora(
                    model,
                    rank=config.lora_rank,
                    alpha=config.lora_alpha,
                    dropout=config.lora_dropout,
                    targets=tuple(config.lora_targets),
                    adapter_dir=adapter_dir,
                )
        self._params = [p for p in policy.parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(
            self._params, lr=config.learning_rate, weight_decay=config.weight_decay
        )
        self._model, self._optimizer = self.accelerator.prepare(policy, optimizer)
        if optimizer_state is None and adapter_dir is not None:
            optimizer_state = Path(adapter_dir) / OPTIMIZER_FILE
        if optimizer_state is not None:
            self._continue_optimizer(Path(optimizer_state))

    @property
    def model(self) -> torch.nn.Module:
        """The trained module (a peft model under LoRA), for evaluation."""
        return self.accelerator.unwrap_model(self._model)

    def step(self, samples: list[Sample], current_version: int | None = None) -> dict[str, float]:
        """One optimiser update over all samples (micro-batches + gradient accumulation); TRL-named metrics."""
        check_samples(samples)
        start = time.perf_counter()
        local = self._shard(samples)
        total = self._global_sum(sum(sum(loss_mask(s)) for s in local))
        if total == 0:
            raise ValueError("no completion token has loss_mask 1: nothing to train on")
        normalizer = total / self.accelerator.num_processes  # DDP averages gradients over processes
        sums: dict[str, float] = defaultdict(float)
        with self._training():
            batches = micro_batches(
                local, self.config.micro_batch_size, self.config.micro_batch_tokens
            )
            for i, chunk in enumerate(batches):
                with self._sync_on(i == len(batches) - 1):
                    self._pg_micro_step(chunk, normalizer, sums)
            grad_norm = self._optimiser_step()
        reduced = self._reduce(sums)
        # each process's loss is its tokens' sum over total / world: their sum is world x the mean
        reduced["loss"] /= self.accelerator.num_processes
        metrics = pg_metrics(reduced, samples, current_version, self.config.kl_coef > 0)
        metrics["num_tokens"] /= self._copies
        metrics.update(grad_norm=grad_norm, lr=self._lr(), step_time=time.perf_counter() - start)
        return metrics

    def dpo_step(self, pairs: list[PreferencePair]) -> dict[str, float]:
        """One DPO update over all pairs (sequence-level log-prob sums, reference = start policy)."""
        check_pairs(pairs)
        local = self._shard(pairs)
        count = self._global_sum(len(local)) / self.accelerator.num_processes
        # a pair is two sequences: its prompt with the longer side, twice
        chunks = token_chunks(
            local,
            max(1, self.config.micro_batch_size // 2),
            max(1, self.config.micro_batch_tokens // 2),
            lambda p: len(p.prompt_ids) + max(len(p.chosen_ids), len(p.rejected_ids)),
        )
        sums: dict[str, float] = defaultdict(float)
        with self._training():
            for i, chunk in enumerate(chunks):
                with self._sync_on(i == len(chunks) - 1):
                    self._dpo_micro_step(chunk, count, sums)
            grad_norm = self._optimiser_step()
        s = self._reduce(sums)
        n = s["pairs"]
        return {
            "loss": s["loss"] / n,
            "rewards/chosen": s["chosen"] / n,
            "rewards/rejected": s["rejected"] / n,
            "rewards/margins": s["margin"] / n,
            "rewards/accuracies": s["accuracy"] / n,
            "nll": s["nll"] / n,
            "grad_norm": grad_norm,
            "lr": self._lr(),
        }

    def kto_step(self, examples: list[Judged]) -> dict[str, float]:
        """One KTO update over judged answers (sequence-level sums, reference = start policy).

        The reference point z0 pairs each answer's completion with the previous example's
        prompt (TRL's mismatched pairs), measured once for the whole step without gradient.
        """
        check_judged(examples)
        local = self._shard(examples)
        count = self._global_sum(len(local)) / self.accelerator.num_processes
        z0 = self._kto_reference_point(local)
        chunks = token_chunks(
            local,
            self.config.micro_batch_size,
            self.config.micro_batch_tokens,
            lambda e: len(e.prompt_ids) + len(e.completion_ids),
        )
        sums: dict[str, float] = defaultdict(float)
        with self._training():
            for i, chunk in enumerate(chunks):
                with self._sync_on(i == len(chunks) - 1):
                    self._kto_micro_step(chunk, z0, count, sums)
            grad_norm = self._optimiser_step()
        s = self._reduce(sums)
        good, bad = s.get("good", 0.0), s.get("bad", 0.0)
        return {
            "loss": s["loss"] / (good + bad),
            "kl": float(z0),
            "rewards/chosen": s["chosen"] / good if good else math.nan,
            "rewards/rejected": s["rejected"] / bad if bad else math.nan,
            "count/desirable": good / self._copies,
            "count/undesirable": bad / self._copies,
            "grad_norm": grad_norm,
            "lr": self._lr(),
        }

    def frozen_view(self):
        """(module, context): the start weights, untouched by this trainer (LoRA: the adapter
        off; full: the frozen copy), e.g. to compute features that must not drift mid-round."""
        return reference_view(self.model, self._frozen_ref)

    def save(self, directory: Path) -> None:
        """Write the adapter (adapter_config.json + adapter_model.safetensors) or the full weights,
        and AdamW's state (optimizer.pt; identical on every DDP process)."""
        self.accelerator.wait_for_everyone()
        if self.accelerator.is_main_process:
            self.model.save_pretrained(Path(directory))
            torch.save(self._optimizer.state_dict(), Path(directory) / OPTIMIZER_FILE)

    # -- one micro-batch -------------------------------------------------------------------

    def _pg_micro_step(
        self, chunk: list[Sample], normalizer: float, sums: dict[str, float]
    ) -> None:
        batch = self._batch([s.prompt_ids for s in chunk], [s.completion_ids for s in chunk], chunk)
        ref_logp = self._reference_logprobs(batch) if self.config.kl_coef > 0 else None
        with self.accelerator.autocast():
            logp, entropy = selected_logprobs(
                self._model, batch, with_entropy=True, entropy_grad=self.config.entropy_coef > 0
            )  # (N,), (N,)
        proximal = flat_proximal(chunk, logp)  # (N,)
        behaviour, logged = flat_behaviour(chunk, proximal)  # (N,), (N,) bool
        advantages = flat_advantages(chunk, logp)  # (N,)
        out = clipped_pg_loss(
            logp,
            behaviour,
            advantages,
            torch.ones_like(logp),
            proximal_logp=proximal,
            is_cap=self.config.is_cap,
            ref_logp=ref_logp,
            clip_eps=self.config.clip_eps,
            kl_coef=self.config.kl_coef,
            entropy=entropy,
            entropy_coef=self.config.entropy_coef,
            normalizer=normalizer,
        )
        self.accelerator.backward(out.loss)
        n = float(out.num_tokens)
        sums["loss"] += float(out.loss.detach())
        sums["tokens"] += n
        for name in TOKEN_MEANS:
            sums[name] += float(getattr(out, name)) * n
        add_corr_sums(sums, behaviour[logged], logp.detach()[logged])

    def _dpo_micro_step(
        self, chunk: list[PreferencePair], count: float, sums: dict[str, float]
    ) -> None:
        k = len(chunk)
        prompts = [p.prompt_ids for p in chunk] * 2
        batch = self._batch(
            prompts, [p.chosen_ids for p in chunk] + [p.rejected_ids for p in chunk]
        )
        ref = self._sequence_sums(batch, self._reference_logprobs(batch))  # (2k,)
        with self.accelerator.autocast():
            logp, _ = selected_logprobs(self._model, batch)  # (N,)
        policy = self._sequence_sums(batch, logp)  # (2k,)
        out = dpo_loss(policy[:k], policy[k:], ref[:k], ref[k:], beta=self.config.dpo_beta)
        nll = _chosen_nll(chunk, batch, logp)  # (k,) 0 where a pair weighs none
        loss = out.loss + nll.mean()
        self.accelerator.backward(loss * (k / count))  # the pairs' mean over the whole step
        sums["nll"] += float(nll.detach().sum())
        sums["pairs"] += k
        sums["loss"] += float(out.loss.detach()) * k
        sums["chosen"] += float(out.chosen_reward.sum())
        sums["rejected"] += float(out.rejected_reward.sum())
        sums["margin"] += float(out.reward_margin) * k
        sums["accuracy"] += float(out.accuracy) * k

    def _kto_micro_step(
        self, chunk: list[Judged], z0: torch.Tensor, count: float, sums: dict[str, float]
    ) -> None:
        batch = self._batch([e.prompt_ids for e in chunk], [e.completion_ids for e in chunk])
        ref = self._sequence_sums(batch, self._reference_logprobs(batch))  # (B,)
        with self.accelerator.autocast():
            logp, _ = selected_logprobs(self._model, batch)  # (N,)
        policy = self._sequence_sums(batch, logp)  # (B,)
        good = torch.tensor([e.desirable for e in chunk], device=policy.device)  # (B,)
        weights = torch.tensor([e.weight for e in chunk], device=policy.device)  # (B,)
        out = kto_loss(policy, ref, good, z0, beta=self.config.kto_beta, weights=weights)
        self.accelerator.backward(out.losses.sum() / count)  # the answers' mean over the step
        sums["loss"] += float(out.losses.detach().sum())
        sums["good"] += float(good.sum())
        sums["bad"] += float((~good).sum())
        sums["chosen"] += float(out.rewards[good].sum())
        sums["rejected"] += float(out.rewards[~good].sum())

    def _kto_reference_point(self, examples: list[Judged]) -> torch.Tensor:
        """z0 over the step: each completion after the previous example's prompt, policy vs ref."""
        prompts = [e.prompt_ids for e in examples]
        shifted = [examples[i - 1].completion_ids for i in range(len(examples))]
        sums: dict[str, float] = defaultdict(float)
        for i in range(0, len(prompts), self.config.micro_batch_size):
            batch = self._batch(
                prompts[i : i + self.config.micro_batch_size],
                shifted[i : i + self.config.micro_batch_size],
            )
            with torch.no_grad(), self.accelerator.autocast():
                logp, _ = selected_logprobs(self._model, batch)
            ref = self._sequence_sums(batch, self._reference_logprobs(batch))  # (B,)
            policy = self._sequence_sums(batch, logp)  # (B,)
            sums["diff"] += float((policy - ref).sum())
            sums["n"] += len(ref)
        s = self._reduce(sums)
        mean = torch.tensor(s["diff"] / s["n"], dtype=torch.float64)
        return kto_reference_point(mean.view(1), torch.zeros(1, dtype=torch.float64))

    def _reference_logprobs(self, batch: TokenBatch) -> torch.Tensor:
        module, context = reference_view(self.model, self._frozen_ref)
        with torch.no_grad(), context, self.accelerator.autocast():
            logp, _ = selected_logprobs(module, batch)
        return logp  # (N,)

    @staticmethod
    def _sequence_sums(batch: TokenBatch, logp: torch.Tensor) -> torch.Tensor:
        counts = batch.completion_mask.sum(1).long()  # (B,)
        rows = torch.repeat_interleave(
            torch.arange(len(counts), device=logp.device), counts
        )  # (N,)
        return torch.zeros(len(counts), dtype=logp.dtype, device=logp.device).index_add(
            0, rows, logp
        )

    # -- plumbing --------------------------------------------------------------------------

    def _continue_optimizer(self, path: Path) -> None:
        """Load AdamW's moments from `path` when they fit these parameters; else keep a fresh AdamW."""
        if not path.exists():
            log.info("no optimizer state at %s: starting a fresh AdamW", path)
            return
        try:
            # on the CPU: load_state_dict moves each moment to its parameter's device (and
            # accelerate's multi-CPU device, cpu:<rank>, is no map_location torch.load knows)
            state = torch.load(path, map_location="cpu", weights_only=True)
            _check_fits(self._optimizer, state)
            self._optimizer.load_state_dict(state)
        except Exception as exc:  # a bad file raises many types; a fresh AdamW still trains
            log.warning("optimizer state %s not used (%s): starting a fresh AdamW", path, exc)
            return
        for group in self._optimizer.param_groups:  # this round's knobs, not the saved round's
            group.update(lr=self.config.learning_rate, weight_decay=self.config.weight_decay)

    def _batch(self, prompts, completions, samples: list[Sample] | None = None) -> TokenBatch:
        masks = None if samples is None else [loss_mask(s) for s in samples]
        b = make_batch(prompts, completions, self.pad_id, masks)
        device = self.accelerator.device
        return TokenBatch(
            b.input_ids.to(device), b.attention_mask.to(device), b.completion_mask.to(device)
        )

    def _optimiser_step(self) -> float:
        max_norm = self.config.max_grad_norm if self.config.max_grad_norm > 0 else math.inf
        grad_norm = self.accelerator.clip_grad_norm_(self._params, max_norm)
        self._optimizer.step()
        self._optimizer.zero_grad(set_to_none=True)
        return float(grad_norm)

    @contextmanager
    def _training(self) -> Iterator[None]:
        """Train mode for one update; after it (or its error) eval mode, and the pass's freed
        activations handed back to the OS (`learner.heap`)."""
        self._model.train()
        try:
            yield
        finally:
            self._model.eval()
            trim_heap()

    def _sync_on(self, last: bool):
        return nullcontext() if last else self.accelerator.no_sync(self._model)

    def _shard(self, items: list) -> list:
        """This process's share of a step's items: `items[rank::world]`. With fewer items than
        processes every item is taken `copies` times (each rank needs one to join the
        all-reduce); every mean the step takes is the same, only counts grow `copies` times."""
        world, rank = self.accelerator.num_processes, self.accelerator.process_index
        self._copies = -(-world // len(items)) if items else 1
        return (items * self._copies)[rank::world]

    def _global_sum(self, value: float) -> float:
        return self._reduce({"v": float(value)})["v"]

    def _reduce(self, sums: dict[str, float]) -> dict[str, float]:
        if self.accelerator.num_processes == 1:
            return dict(sums)
        keys = sorted(sums)
        packed = torch.tensor(
            [sums[k] for k in keys], dtype=torch.float64, device=self.accelerator.device
        )
        packed = self.accelerator.reduce(packed, reduction="sum")
        return dict(zip(keys, packed.tolist(), strict=True))

    def _lr(self) -> float:
        return float(self._optimizer.param_groups[0]["lr"])


def _chosen_nll(chunk: list[PreferencePair], batch: TokenBatch, logp: torch.Tensor) -> torch.Tensor:
    """(k,) each pair's `nll_weight` times the mean negative log-prob of its chosen tokens from
    `nll_from` on; `logp` (N,) holds the batch's completion tokens row by row, chosen first."""
    counts = batch.completion_mask.sum(1).long().tolist()  # (2k,)
    starts = [0]
    for n in counts[:-1]:
        starts.append(starts[-1] + n)
    out = []
    for pair, start, n in zip(chunk, starts, counts, strict=False):
        lo = min(pair.nll_from, n)
        if pair.nll_weight == 0.0 or lo >= n:
            out.append(logp.new_zeros(()))
            continue
        out.append(-pair.nll_weight * logp[start + lo : start + n].mean())
    return torch.stack(out)


def _check_fits(optimizer: torch.optim.Optimizer, state: dict) -> None:
    """Raise ValueError unless a saved optimizer state holds moments shaped like these parameters.

    `load_state_dict` checks only the parameter count, and a LoRA of another rank has the same
    count: its moments would load and break the first step.
    """
    params = [p for group in optimizer.param_groups for p in group["params"]]
    keys = [k for group in state["param_groups"] for k in group["params"]]
    if len(keys) != len(params):
        raise ValueError(f"{len(keys)} parameters saved, {len(params)} trained")
    for p, key in zip(params, keys, strict=True):
        for name, value in state["state"].get(key, {}).items():
            if isinstance(value, torch.Tensor) and value.dim() > 0 and value.shape != p.shape:
                raise ValueError(f"{name} {tuple(value.shape)} for a parameter {tuple(p.shape)}")
