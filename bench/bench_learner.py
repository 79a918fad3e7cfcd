"""One policy update over the same logged episodes: arloop vs TRL 1.16's GRPOTrainer vs a plain torch loop.

Same model (SmolLM2-135M-Instruct, fp32, CPU), same LoRA initialisation, same 64 episodes
(16 prompts x 4 completions sampled from the model at temperature 1, cut to 64-128 tokens,
with the sampler's own logprobs as behaviour logprobs), same loss: token-level clipped
importance-weighted policy gradient against the behaviour logprobs + 0.02 * k3 KL to the
base model (adapter disabled), normalised by the batch's completion-token count (TRL's
`loss_type="dapo"`), micro-batches of 8 accumulated into one AdamW step, grad norm clipped to 1.

TRL: `GRPOTrainer` with its generation replaced by the logged episodes (`_generate_and_score_
completions` overridden to return them, TRL's own code computing the reference logprobs with
the adapter disabled); everything else is TRL's `train()` with max_steps=1: its
`_compute_loss` (fused chunked LM head + entropy), its accumulation, clipping and optimiser.
bf16 and gradient checkpointing off (both slow a CPU down). Its time is taken from step
begin to step end by a callback (excludes `train()`'s set-up, which is printed apart).

Throughput = prompt + completion tokens of the episodes / seconds of the update.
Usage: .venv/bin/python bench/bench_learner.py [--episodes 64] [--group 4] [--random] [--threads N]
"""

from __future__ import annotations

import argparse
import os
import time
import warnings

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
warnings.filterwarnings("ignore")
import transformers

transformers.logging.set_verbosity_error()
transformers.logging.disable_progress_bar()

import torch
from trl_config import grpo_args, lora_config  # bench/ is the script's folder: on sys.path

from deploy.settings import ModelSettings
from learner.advantages import group_advantages
from learner.logprobs import make_batch, selected_logprobs
from learner.lora import attach_lora
from learner.policy.models import load_base
from learner.samples import Sample
from learner.train_step import PolicyTrainer, TrainConfig

MODEL_CACHE = ModelSettings().model_cache  # ARLOOP_MODEL_CACHE, as the processes read it

CONFIG = TrainConfig(
    learning_rate=1e-5, kl_coef=0.02, clip_eps=0.2, micro_batch_size=8, max_grad_norm=1.0
)
QUESTIONS = [
    "What is 17 times 23? Show your steps.",
    "Explain photosynthesis to a ten-year-old.",
    "I have had a headache and fever since yesterday. What should I do?",
    "Write a haiku about the sea.",
    "How many days are there in a leap year, and why?",
    "What is the capital of Australia?",
    "Solve for x: 3x + 7 = 22.",
    "Give me three tips to sleep better.",
    "Why is the sky blue?",
    "Translate 'good morning' into French and Spanish.",
    "What is a prime number? Give examples.",
    "My child has a rash after eating peanuts. Is this serious?",
    "Summarise the water cycle.",
    "How do I compute the area of a circle of radius 4?",
    "What causes the seasons on Earth?",
    "Name three renewable sources of energy.",
]


def synthesise(n_episodes: int, group: int, random_tokens: bool, seed: int = 0) -> list[Sample]:
    """Logged episodes: chat prompts, completions sampled from SmolLM2, their logprobs, rewards."""
    model, tok = load_base("smollm2", cache_dir=MODEL_CACHE)
    g = torch.Generator().manual_seed(seed)
    prompts = [
        tok.apply_chat_template(
            [
                {"role": "system", "content": "You are a helpful assistant."},
                {"role": "user", "content": q},
            ],
            add_generation_prompt=True,
            return_dict=False,
        )
        for q in (QUESTIONS * 8)[: n_episodes // group]
    ]
    completions, logprobs = _sample(model, tok, prompts, group, random_tokens, g)
    lengths = torch.randint(64, 129, (len(completions),), generator=g).tolist()
    rewards = torch.bernoulli(torch.full((len(completions),), 0.5), generator=g)
    groups = torch.arange(len(completions)) // group
    adv = group_advantages(rewards, groups)
    samples = [
        Sample(
            prompt_ids=list(prompts[i // group]),
            completion_ids=completions[i][:n],
            advantage=float(adv[i]),
            behaviour_logprobs=logprobs[i][:n],
            reward=float(rewards[i]),
            group=str(int(groups[i])),
            policy_version=0,
        )
        for i, n in enumerate(lengths)
    ]
    # logs arrive interleaved, not grouped by prompt
    order = torch.randperm(len(samples), generator=g).tolist()
    return [samples[i] for i in order]


def _sample(
    model, tok, prompts, group, random_tokens, g
) -> tuple[list[list[int]], list[list[float]]]:
    if random_tokens:  # quick mode: random ids, logprobs from one teacher-forced pass
        comps = [
            torch.randint(100, 40000, (128,), generator=g).tolist()
            for _ in range(len(prompts) * group)
        ]
        return comps, _teacher_logprobs(
            model, [prompts[i // group] for i in range(len(comps))], comps
        )
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[tok.pad_token_id] * (width - len(p)) + list(p) for p in prompts])
    attn = (torch.arange(width) >= torch.tensor([width - len(p) for p in prompts])[:, None]).long()
    torch.manual_seed(int(torch.randint(0, 2**31, (1,), generator=g)))
    with torch.no_grad():
        out = model.generate(
            input_ids=ids,
            attention_mask=attn,
            do_sample=True,
            temperature=1.0,
            top_k=0,
            top_p=1.0,
            max_new_tokens=128,
            min_new_tokens=128,
            num_return_sequences=group,
            output_logits=True,
            return_dict_in_generate=True,
            pad_token_id=tok.pad_token_id,
        )
    new = out.sequences[:, width:]  # (N, 128)
    logits = torch.stack(out.logits, dim=1).float()  # (N, 128, V) the sampler's own distribution
    lp = torch.log_softmax(logits, -1).gather(-1, new.unsqueeze(-1)).squeeze(-1)  # (N, 128)
    return new.tolist(), lp.tolist()


def _teacher_logprobs(model, prompts, completions, size: int = 8) -> list[list[float]]:
    out = []
    for i in range(0, len(prompts), size):
        batch = make_batch(prompts[i : i + size], completions[i : i + size], pad_id=0)
        with torch.no_grad():
            flat, _ = selected_logprobs(model, batch)
        out += [x.tolist() for x in flat.split([len(c) for c in completions[i : i + size]])]
    return out


def fresh_policy():
    """SmolLM2 with the LoRA adapter every method starts from (same seed, same weights)."""
    model, _ = load_base("smollm2", cache_dir=MODEL_CACHE)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(CONFIG.seed)
        return attach_lora(
            model,
            rank=CONFIG.lora_rank,
            alpha=CONFIG.lora_alpha,
            dropout=0.0,
            targets=CONFIG.lora_targets,
        )


def lora_state(model) -> dict[str, torch.Tensor]:
    return {
        k: v.detach().clone()
        for k, v in model.named_parameters()
        if "lora_" in k and ".default." in k
    }


# -- the plain loop: the limit ---------------------------------------------------------------------


def plain_update(model, samples: list[Sample], pad_id: int) -> float:
    """The same update written as a plain torch loop (full logits, input order, no extras)."""
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=CONFIG.learning_rate)
    total = sum(len(s.completion_ids) for s in samples)
    model.train()
    loss_sum = 0.0
    for i in range(0, len(samples), CONFIG.micro_batch_size):
        chunk = samples[i : i + CONFIG.micro_batch_size]
        T = max(len(s.prompt_ids) + len(s.completion_ids) for s in chunk)
        ids = torch.full((len(chunk), T), pad_id)
        attn, mask, beh = (
            torch.zeros_like(ids),
            torch.zeros(len(chunk), T),
            torch.zeros(len(chunk), T),
        )
        for b, s in enumerate(chunk):
            p, c = len(s.prompt_ids), len(s.completion_ids)
            ids[b, : p + c] = torch.tensor(s.prompt_ids + s.completion_ids)
            attn[b, : p + c] = 1
            mask[b, p : p + c] = 1
            beh[b, p : p + c] = torch.tensor(s.behaviour_logprobs)
        mask, beh = mask[:, 1:], beh[:, 1:]
        adv = torch.tensor([s.advantage for s in chunk])[:, None]
        with torch.no_grad(), model.disable_adapter():
            ref = _plain_logprobs(model, ids, attn)
        logp = _plain_logprobs(model, ids, attn)
        ratio = torch.exp(logp - beh)
        pg = -torch.min(ratio * adv, ratio.clamp(1 - CONFIG.clip_eps, 1 + CONFIG.clip_eps) * adv)
        kl = torch.exp(ref - logp) - (ref - logp) - 1
        loss = ((pg + CONFIG.kl_coef * kl) * mask).sum() / total
        loss.backward()
        loss_sum += float(loss)
    torch.nn.utils.clip_grad_norm_(params, CONFIG.max_grad_norm)
    opt.step()
    opt.zero_grad()
    model.eval()
    return loss_sum


def _plain_logprobs(model, ids, attn):
    logits = model(input_ids=ids, attention_mask=attn).logits[:, :-1]
    return torch.log_softmax(logits.float(), -1).gather(-1, ids[:, 1:, None]).squeeze(-1)


# -- TRL -----------------------------------------------------------------------------------------


def trl_update(samples: list[Sample], pad_id: int, tokenizer) -> tuple[float, float, float, dict]:
    """(step seconds, train() seconds, loss, adapter after) for TRL's GRPOTrainer on the logged episodes."""
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOTrainer
    from trl.trainer.utils import use_adapter

    class LoggedGRPOTrainer(GRPOTrainer):
        """GRPOTrainer fed logged episodes instead of sampling; TRL computes the rest."""

        def _generate_and_score_completions(self, inputs):
            batch = _trl_batch(samples, pad_id)
            ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], 1)
            attn = torch.cat([batch["prompt_mask"], batch["completion_mask"]], 1)
            with torch.no_grad():  # as TRL does for a PEFT policy with beta != 0
                model = self.accelerator.unwrap_model(self.model)
                with use_adapter(model, adapter_name="ref" if "ref" in model.peft_config else None):
                    ref, _, _ = self._get_per_token_logps_and_entropies(
                        self.model,
                        ids,
                        attn,
                        batch["completion_ids"].size(1),
                        batch_size=self.args.per_device_train_batch_size,
                    )
            batch["ref_per_token_logps"] = ref
            batch["num_items_in_batch"] = batch["completion_mask"].sum()
            return batch

    class StepTimer(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            self.start = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            self.seconds = time.perf_counter() - self.start

    n_prompts = len({s.group for s in samples})
    group = len(samples) // n_prompts
    args = grpo_args(
        CONFIG,
        per_device_train_batch_size=CONFIG.micro_batch_size,
        gradient_accumulation_steps=len(samples) // CONFIG.micro_batch_size,
        steps_per_generation=len(samples) // CONFIG.micro_batch_size,
        num_generations=group,
        max_steps=1,
        learning_rate=CONFIG.learning_rate,
        beta=CONFIG.kl_coef,
        seed=CONFIG.seed,
        max_completion_length=128,
    )
    model, _ = load_base("smollm2", cache_dir=MODEL_CACHE)
    peft_config = lora_config(CONFIG)
    timer = StepTimer()
    trainer = LoggedGRPOTrainer(
        model=model,
        reward_funcs=lambda completions, **kw: [0.0] * len(completions),
        args=args,
        train_dataset=Dataset.from_dict({"prompt": [f"p{i}" for i in range(n_prompts)]}),
        processing_class=tokenizer,
        peft_config=peft_config,
        callbacks=[timer],
    )
    start_weights = lora_state(fresh_policy())
    with torch.no_grad():  # the same adapter initialisation as the other two
        for name, p in trainer.model.named_parameters():
            if name in start_weights:
                p.copy_(start_weights[name])
    start = time.perf_counter()
    trainer.train()
    total = time.perf_counter() - start
    loss = next(h["loss"] for h in trainer.state.log_history if "loss" in h)
    return timer.seconds, total, loss, lora_state(trainer.model)


def _trl_batch(samples: list[Sample], pad_id: int) -> dict[str, torch.Tensor]:
    """TRL's layout: prompts left-padded, completions right-padded, logprobs per completion slot."""
    P = max(len(s.prompt_ids) for s in samples)
    C = max(len(s.completion_ids) for s in samples)
    out = {
        k: torch.zeros(len(samples), P if k.startswith("prompt") else C, dtype=torch.long)
        for k in ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask")
    }
    out["prompt_ids"].fill_(pad_id)
    out["completion_ids"].fill_(pad_id)
    old = torch.zeros(len(samples), C)
    for b, s in enumerate(samples):
        p, c = len(s.prompt_ids), len(s.completion_ids)
        out["prompt_ids"][b, P - p :] = torch.tensor(s.prompt_ids)
        out["prompt_mask"][b, P - p :] = 1
        out["completion_ids"][b, :c] = torch.tensor(s.completion_ids)
        out["completion_mask"][b, :c] = 1
        old[b, :c] = torch.tensor(s.behaviour_logprobs)
    out["advantages"] = torch.tensor([s.advantage for s in samples])
    out["old_per_token_logps"] = old
    return out


# -- the run ---------------------------------------------------------------------------------------


def _delta_gap(after: dict, start: dict, reference_after: dict) -> float:
    """||update - plain loop's update|| / ||plain loop's update|| over the adapter weights."""
    num = sum(
        float(((after[k] - start[k]) - (reference_after[k] - start[k])).norm() ** 2) for k in start
    )
    den = sum(float((reference_after[k] - start[k]).norm() ** 2) for k in start)
    return (num / den) ** 0.5


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--episodes", type=int, default=64)
    ap.add_argument("--group", type=int, default=4, help="completions per prompt")
    ap.add_argument("--random", action="store_true", help="random completion ids (skips sampling)")
    ap.add_argument(
        "--threads", type=int, default=0, help="torch threads for all three (0: torch's default)"
    )
    a = ap.parse_args()
    if a.threads:  # on an oversubscribed machine, spinning OpenMP threads cost more than they give
        torch.set_num_threads(a.threads)
    t0 = time.perf_counter()
    samples = synthesise(a.episodes, a.group, a.random)
    _, tokenizer = load_base("smollm2", cache_dir=MODEL_CACHE)
    pad = tokenizer.pad_token_id
    tokens = sum(len(s.prompt_ids) + len(s.completion_ids) for s in samples)
    comp = sum(len(s.completion_ids) for s in samples)
    print(
        f"{len(samples)} episodes, {tokens} tokens ({comp} completion), synthesised in "
        f"{time.perf_counter() - t0:.0f} s; torch {torch.__version__}, {torch.get_num_threads()} threads"
    )

    _warm_up(samples[:2], pad)
    start = lora_state(fresh_policy())
    rows = {}

    policy = fresh_policy()
    t = time.perf_counter()
    loss = plain_update(policy, samples, pad)
    rows["plain torch loop"] = (time.perf_counter() - t, loss, lora_state(policy))

    trainer = PolicyTrainer(load_base("smollm2", cache_dir=MODEL_CACHE)[0], pad, CONFIG)
    t = time.perf_counter()
    metrics = trainer.step(samples, current_version=1)
    rows["arloop PolicyTrainer.step"] = (
        time.perf_counter() - t,
        metrics["loss"],
        lora_state(trainer.model),
    )

    seconds, total, loss, after = trl_update(samples, pad, tokenizer)
    rows["TRL 1.16 GRPOTrainer"] = (seconds, loss, after)

    plain = rows["plain torch loop"]
    print(
        f"\n{'method':28s} {'seconds':>8s} {'tokens/s':>9s} {'loss':>10s} {'update gap vs plain':>20s}"
    )
    for name, (sec, loss, after) in rows.items():
        gap = _delta_gap(after, start, plain[2])
        print(f"{name:28s} {sec:8.1f} {tokens / sec:9.1f} {loss:10.5f} {gap:20.2e}")
    ours, trl = rows["arloop PolicyTrainer.step"][0], rows["TRL 1.16 GRPOTrainer"][0]
    print(f"\n(TRL train() including its set-up: {total:.1f} s)")
    print(f"arloop vs TRL:        {trl / ours:.2f}x  (target >= 1.0x)")
    print(f"arloop vs plain loop: {plain[0] / ours:.2f}x  (target >= 0.8x)")
    print("arloop metrics: " + ", ".join(f"{k}={v:.4g}" for k, v in metrics.items()))


def _warm_up(samples: list[Sample], pad: int) -> None:
    """A small forward/backward so no method pays for first-call set-up."""
    short = [
        Sample(s.prompt_ids, s.completion_ids[:16], s.advantage, s.behaviour_logprobs[:16])
        for s in samples
    ]
    plain_update(fresh_policy(), short, pad)


if __name__ == "__main__":
    main()
