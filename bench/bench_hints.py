"""What a hinted run gives the sub-rounds: how often the model, shown a prompt's label, reaches it
through its tool rather than by copying the hint.

A sub-round gives a labelled prompt none of whose runs reached the label `hint_n` more runs with
the label stated in the prompt (`learner.resample.hinted`, STaR's rationalisation); a hinted run
trains only if it reached the label and a tool's output stated it before the model did
(`learner.resample.derived`). Here, on the pack's first problems (the demo's rounds in order,
the agent's first call as the learner replays it; SmolLM2-135M-Instruct fp32 with its LoRA
attached, the demo's temperature and token budget), each prompt is replayed `--n` times
without the hint (the peer: what a sub-round sees first) and `--n` times with it, and each
hinted run is counted as usable (solved, the answer from the tool), copied (solved, the model
wrote the answer before any tool said it) or unsolved. The figure that matters is the last
line: of the prompts no plain run solved, how many the first `--hint-n` hinted runs rescue
(give at least one usable success), against none without hints.

Usage: .venv/bin/python bench/bench_hints.py [--pack tutoring] [--prompts 40] [--n 8]
       [--hint-n 2] [--threads 2] [--hint-text "(... {answer} ...)"]
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--pack", choices=("tutoring", "medical"), default="tutoring")
    p.add_argument("--prompts", type=int, default=40, help="problems replayed")
    p.add_argument("--n", type=int, default=8, help="runs of each prompt, plain and hinted")
    p.add_argument("--hint-n", type=int, default=2, help="hinted runs a sub-round takes")
    p.add_argument("--threads", type=int, default=2, help="torch threads")
    p.add_argument(
        "--hint-text",
        default=None,
        help="another wording of the hint, with {answer} (default: learner.resample.HINT)",
    )
    a = p.parse_args()

    import torch

    torch.set_num_threads(a.threads)
    from bench_resample import first_calls  # bench/ is the script's folder: on sys.path

    import learner.resample
    from deploy.settings import ModelSettings
    from learner.policy.models import load_base
    from learner.resample import derived, hinted, replay
    from learner.train_step import PolicyTrainer, TrainConfig

    model, tokenizer = load_base("smollm2", cache_dir=ModelSettings().model_cache)
    trainer = PolicyTrainer(model, tokenizer.pad_token_id or 0, TrainConfig())
    starts = first_calls(a.pack, a.prompts, tokenizer)
    if a.hint_text is not None:
        learner.resample.HINT = a.hint_text  # `hinted` reads it when called
    hints = [hinted(s) for s in starts]
    if any(h is None for h in hints):
        raise SystemExit(f"the {a.pack} agent has no tools or a prompt is not text: no hints")
    kw = {"n": a.n, "temperature": 0.7, "max_tokens": 32, "max_batch_size": 32}
    t = time.perf_counter()
    plain = replay(trainer.model, tokenizer, starts, seed=0, **kw)
    plain_s = time.perf_counter() - t
    t = time.perf_counter()
    shown = replay(trainer.model, tokenizer, hints, seed=1, **kw)
    hinted_s = time.perf_counter() - t

    runs = len(starts) * a.n
    usable = copied = 0
    for start, choices in zip(hints, shown, strict=True):
        for run in choices:
            if run.solved and derived(run, start.answer):
                usable += 1
            elif run.solved:
                copied += 1
    failed = [i for i, choices in enumerate(plain) if not any(r.solved for r in choices)]
    rescued = [
        i
        for i in failed
        if any(r.solved and derived(r, hints[i].answer) for r in shown[i][: a.hint_n])
    ]
    rescued_any = [
        i for i in failed if any(r.solved and derived(r, hints[i].answer) for r in shown[i])
    ]
    solved_plain = sum(r.solved for choices in plain for r in choices)

    def share(k: int, of: int) -> str:
        return f"{k}/{of} = {k / of:.0%}" if of else "0/0"

    print(
        f"{a.pack}: {len(starts)} prompts x {a.n} runs each way, SmolLM2 fp32 + LoRA, "
        f"T 0.7, 32 tokens a call (or the agent's own budget), {a.threads} threads; the hint: "
        f"{learner.resample.HINT.format(answer='<label>')!r}"
    )
    print(f"plain runs solved:   {share(solved_plain, runs)}  ({plain_s:.0f} s)")
    print(f"hinted runs solved:  {share(usable + copied, runs)}  ({hinted_s:.0f} s)")
    print(f"  usable (the answer from the tool): {share(usable, runs)}")
    print(f"  copied (the model wrote it first): {share(copied, runs)}")
    print(f"prompts no plain run solved: {share(len(failed), len(starts))}")
    print(
        f"  rescued by the first {a.hint_n} hinted runs (a sub-round's hint_n): "
        f"{share(len(rescued), len(failed))}; by any of {a.n}: {share(len(rescued_any), len(failed))}"
        "; without hints: 0"
    )


if __name__ == "__main__":
    main()
