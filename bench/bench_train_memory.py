"""One learner pass's peak memory and seconds on long rows, against the behaviour before: a
training step with the token cap on a pass and without it (the peer, before
`TrainConfig.micro_batch_tokens`); the reward model's features with the LM head on the last
position only and on every token (the peer, before `learner.logprobs.last_logits_only`).

Each step runs in a process of its own (`ru_maxrss` is a process's peak): SmolLM2-135M-Instruct
fp32 with the learner's LoRA (`PolicyTrainer`), `--rows` rows of a shared system prompt plus a
40-token question (`--prompt` tokens in all) and a `--completion`-token answer, random ids from
a fixed seed. `pg`: one policy-gradient step (advantages +1/-1); `dpo`: one DPO step on `--rows`
pairs (two sequences each, 4 pairs a pass at most), the restated pairs' NLL term on. The
defaults are the triage agent's answers after a knowledge-base search (740 + 80 tokens: its
restated pairs, where the medical round's learner peaked); `--prompt 300 --completion 32` is
the tutor's. `features`: the reward model's features of the `--rows` rows (8 a pass), as a
round fits it on judged runs and scores silent and resampled ones.

Usage: .venv/bin/python bench/bench_train_memory.py [--ops pg,dpo,features] [--prompt 740]
       [--completion 80] [--rows 8] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

NO_CAP = 10**9


def one(a: argparse.Namespace) -> dict:
    """One pass in this process (the peer's code where `a.peer`): its seconds and peak RSS."""
    import torch

    torch.set_num_threads(a.threads)
    from deploy.settings import ModelSettings
    from learner.policy.models import load_base
    from learner.samples import PreferencePair, Sample
    from learner.train_step import PolicyTrainer, TrainConfig

    model, tok = load_base("smollm2", cache_dir=ModelSettings().model_cache)
    config = TrainConfig(micro_batch_tokens=NO_CAP) if a.peer else TrainConfig()
    trainer = PolicyTrainer(model, tok.pad_token_id or 0, config)
    g = torch.Generator().manual_seed(0)

    def ids(n: int) -> list[int]:
        return torch.randint(100, 40000, (n,), generator=g).tolist()

    head = ids(a.prompt - 40)
    rows = [(head + ids(40), ids(a.completion)) for _ in range(a.rows)]
    loaded = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    t = time.perf_counter()
    if a.one == "features":
        import learner.reward_model

        if a.peer:  # the LM head on every token, as before
            learner.reward_model.last_logits_only = lambda model: {}
        learner.reward_model.features(
            trainer.model, [p for p, _ in rows], [c for _, c in rows], tok.pad_token_id or 0
        )
    elif a.one == "pg":
        trainer.step(
            [Sample(p, c, advantage=1.0 if i % 2 else -1.0) for i, (p, c) in enumerate(rows)]
        )
    else:
        trainer.dpo_step(
            [PreferencePair(p, c, c[::-1], nll_weight=1.0, nll_from=len(c) - 4) for p, c in rows]
        )
    return {
        "seconds": time.perf_counter() - t,
        "loaded_mib": loaded,
        "peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument(
        "--ops",
        default="pg,dpo,features",
        help="passes measured, comma-separated: pg, dpo, features",
    )
    p.add_argument("--prompt", type=int, default=740, help="prompt tokens a row")
    p.add_argument("--completion", type=int, default=80, help="completion tokens a row")
    p.add_argument("--rows", type=int, default=8, help="rows (pg) or pairs (dpo) in the step")
    p.add_argument("--threads", type=int, default=2, help="torch threads")
    p.add_argument("--one", choices=("pg", "dpo", "features"), default=None, help=argparse.SUPPRESS)
    p.add_argument("--peer", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.one is not None:
        print(json.dumps(one(a)))
        return
    from learner.train_step import TrainConfig

    cap = TrainConfig().micro_batch_tokens
    print(
        f"SmolLM2 fp32 + LoRA, {a.rows} rows of {a.prompt} + {a.completion} tokens, "
        f"{a.threads} threads; a process per pass; the cap {cap} padded tokens a pass, the peer "
        "none (8 rows, 4 pairs a pass); features: logits at the last position, the peer at all"
    )
    for op in a.ops.split(","):
        got = {}
        for name in ("peer", "ours"):
            cmd = [sys.executable, __file__, "--one", op] + (["--peer"] if name == "peer" else [])
            cmd += ["--prompt", str(a.prompt), "--completion", str(a.completion)]
            cmd += ["--rows", str(a.rows), "--threads", str(a.threads)]
            out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
            got[name] = json.loads(out.strip().splitlines()[-1])
        peer, ours = got["peer"], got["ours"]
        print(
            f"{op:>8s}: peak {ours['peak_mib']:,.0f} MiB vs {peer['peak_mib']:,.0f} the peer "
            f"({ours['peak_mib'] / peer['peak_mib']:.2f}x; the model loaded "
            f"{peer['loaded_mib']:,.0f}); {ours['seconds']:.1f} s vs {peer['seconds']:.1f} s "
            f"({ours['seconds'] / peer['seconds']:.2f}x)"
        )


if __name__ == "__main__":
    main()
