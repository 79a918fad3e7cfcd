"""Whether the policy shown a prompt's label is a teacher worth distilling from: does its
per-token preference over the student's own runs point at the runs that solved?

Self-distillation from privileged context (SDFT, on-policy distillation with the correction in
the teacher's prompt) trains each token of a run the student sampled by how much more the
teacher, the same weights with the label stated (`learner.resample.hinted`), expects it than
the student does: log p_teacher - log p_student, summed over the run's tokens, is the run's
reverse-KL advantage. It can teach only if that advantage is higher on runs that reach the
label than on runs that do not. Here, on the pack's first problems (SmolLM2-135M-Instruct fp32
with its LoRA attached, each prompt `--n` runs at the demo's temperature), every run's first
call (the tool call the calculator then answers) is scored by both prompts, and for each
prompt that has solved and unsolved runs, every (solved, unsolved) pair is checked: a share of
pairs above 0.5 means the teacher prefers the solved run. The peers, from the same runs: the
student's own log-probability (its confidence) and the teacher's alone.

Usage: .venv/bin/python bench/bench_self_teacher.py [--pack tutoring] [--prompts 40] [--n 8]
       [--seed 0] [--threads 2]
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")


def run_logprobs(model, pad_id: int, prompts, completions, size: int = 8) -> list[float]:
    """Summed log-probability of each completion after its prompt, `size` rows a pass."""
    import torch

    from learner.logprobs import make_batch, selected_logprobs

    sums: list[float] = []
    with torch.no_grad():
        for i in range(0, len(prompts), size):
            batch = make_batch(prompts[i : i + size], completions[i : i + size], pad_id)
            logp, _ = selected_logprobs(model, batch)  # (N,): the completions' tokens, row by row
            counts = batch.completion_mask.sum(1).long().tolist()  # (B,)
            sums += [float(part.sum()) for part in logp.split(counts)]
    return sums


def pair_share(groups: list[list[tuple[float, bool]]]) -> tuple[float, int]:
    """(share of (solved, unsolved) pairs within a prompt where the solved run scores higher,
    ties half; how many pairs)."""
    wins, pairs = 0.0, 0
    for group in groups:
        for good, ok in group:
            for bad, ok_bad in group:
                if ok and not ok_bad:
                    pairs += 1
                    wins += 1.0 if good > bad else 0.5 if good == bad else 0.0
    return (wins / pairs if pairs else float("nan")), pairs


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--pack", choices=("tutoring", "medical"), default="tutoring")
    p.add_argument("--prompts", type=int, default=40, help="problems replayed")
    p.add_argument("--n", type=int, default=8, help="runs of each prompt")
    p.add_argument("--seed", type=int, default=0, help="seeds the runs")
    p.add_argument("--threads", type=int, default=2, help="torch threads")
    a = p.parse_args()

    import torch

    torch.set_num_threads(a.threads)
    from bench_resample import first_calls  # bench/ is the script's folder: on sys.path

    from deploy.settings import ModelSettings
    from learner.policy.models import load_base
    from learner.resample import hint_prompt_ids, hinted, replay
    from learner.train_step import PolicyTrainer, TrainConfig

    model, tokenizer = load_base("smollm2", cache_dir=ModelSettings().model_cache)
    pad_id = tokenizer.pad_token_id or 0
    trainer = PolicyTrainer(model, pad_id, TrainConfig())
    starts = first_calls(a.pack, a.prompts, tokenizer)
    hints = [hinted(s) for s in starts]
    if any(h is None for h in hints):
        raise SystemExit(f"the {a.pack} agent has no tools or a prompt is not text: no teacher")
    t = time.perf_counter()
    runs = replay(
        trainer.model,
        tokenizer,
        starts,
        n=a.n,
        temperature=0.7,
        max_tokens=32,
        seed=a.seed,
        max_batch_size=32,
    )
    sample_s = time.perf_counter() - t

    t = time.perf_counter()
    firsts = [(i, run.turns[0]) for i, choices in enumerate(runs) for run in choices]
    teacher_prompts = [hint_prompt_ids(h, tokenizer) for h in hints]
    completions = [turn.completion_ids for _, turn in firsts]
    student = run_logprobs(
        trainer.model, pad_id, [turn.prompt_ids for _, turn in firsts], completions
    )
    teacher = run_logprobs(
        trainer.model, pad_id, [teacher_prompts[i] for i, _ in firsts], completions
    )
    score_s = time.perf_counter() - t

    solved = [run.solved for choices in runs for run in choices]
    tokens = [len(c) for c in completions]

    def grouped(values: list[float]) -> list[list[tuple[float, bool]]]:
        groups: list[list[tuple[float, bool]]] = [[] for _ in starts]
        for (i, _), v, ok in zip(firsts, values, solved, strict=True):
            groups[i].append((v, ok))
        return groups

    advantage = [tt - s for tt, s in zip(teacher, student, strict=True)]
    per_token = [v / max(n, 1) for v, n in zip(advantage, tokens, strict=True)]
    mixed = sum(0 < sum(ok for _, ok in g) < len(g) for g in grouped(advantage))
    failed = [g for g in grouped(advantage) if not any(ok for _, ok in g)]
    print(
        f"{a.pack}: {len(starts)} prompts x {a.n} runs, SmolLM2 fp32 + LoRA, T 0.7, "
        f"seed {a.seed}, {a.threads} threads; runs sampled in {sample_s:.0f} s, scored twice in {score_s:.0f} s"
    )
    print(
        f"solved {sum(solved)}/{len(solved)}; prompts with solved and unsolved runs: {mixed}; "
        f"with none solved: {len(failed)}"
    )
    for name, values in (
        ("teacher - student (SDFT's run advantage)", advantage),
        ("the same per token", per_token),
        ("peer: the student's own log-probability", student),
        ("peer: the teacher's log-probability alone", teacher),
    ):
        share, pairs = pair_share(grouped(values))
        print(f"  {name}: prefers the solved run in {share:.0%} of {pairs} pairs")
    spread = [v for g in failed for v, _ in g]
    if spread:
        mean = sum(spread) / len(spread)
        print(
            f"prompts none solved: mean advantage {mean:+.2f} nats a run "
            f"({min(spread):+.2f}..{max(spread):+.2f}); no run there to say which way is right"
        )


if __name__ == "__main__":
    main()
