"""One learner pass's peak memory and seconds on long rows, against the behaviour before: a
training step with the token cap on a pass and without it (the peer, before
`TrainConfig.micro_batch_tokens`); a step after a step, with the heap trimmed between them and
without; the reward model's features with the LM head on the last position only and on every
token (the peer, before `learner.logprobs.last_logits_only`).

Each step runs in a process of its own (`ru_maxrss` is a process's peak): SmolLM2-135M-Instruct
fp32 with the learner's LoRA (`PolicyTrainer`), `--rows` rows of a shared system prompt plus a
40-token question (`--prompt` tokens in all) and a `--completion`-token answer, random ids from
a fixed seed. `pg`: one policy-gradient step (advantages +1/-1); `dpo`: one DPO step on `--rows`
pairs (two sequences each, 4 pairs a pass at most), the restated pairs' NLL term on. The
defaults are the triage agent's answers after a knowledge-base search (740 + 80 tokens: its
restated pairs, where the medical round's learner peaked); `--prompt 300 --completion 32` is
the tutor's; `--distinct` gives each row its own prompt (no head shared: a sub-round's pass
holds several prompts' runs); `--caps 2048,1024` measures other caps beside the default.
`features`: the reward model's features of the `--rows` rows (8 a pass), as a round fits it on
judged runs and scores silent and resampled ones. `pg-dpo`: a policy-gradient step, then a DPO
step on the same rows, as a round runs them: the memory resting between them and the DPO
step's own peak, with the heap trimmed after each step (`learner.heap.trim_heap`) and without
(the peer: freed pages kept by glibc, as before).

Usage: .venv/bin/python bench/bench_train_memory.py [--ops pg,dpo,features] [--prompt 740]
       [--completion 80] [--rows 8] [--distinct] [--caps 2048,1024] [--threads 2]
       (pg-dpo reads /proc: Linux only)
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
    cap = NO_CAP if a.peer and a.one in ("pg", "dpo") else a.cap
    config = TrainConfig(micro_batch_tokens=cap) if cap else TrainConfig()
    trainer = PolicyTrainer(model, tok.pad_token_id or 0, config)
    g = torch.Generator().manual_seed(0)

    def ids(n: int) -> list[int]:
        return torch.randint(100, 40000, (n,), generator=g).tolist()

    head = [] if a.distinct else ids(a.prompt - 40)
    rows = [(head + ids(a.prompt - len(head)), ids(a.completion)) for _ in range(a.rows)]
    samples = [Sample(p, c, advantage=1.0 if i % 2 else -1.0) for i, (p, c) in enumerate(rows)]
    pairs = [PreferencePair(p, c, c[::-1], nll_weight=1.0, nll_from=len(c) - 4) for p, c in rows]
    loaded = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    t = time.perf_counter()
    if a.one == "pg-dpo":
        import learner.train_step

        if a.peer:  # freed pages kept by glibc, as before
            learner.train_step.trim_heap = lambda: False
        trainer.step(samples)
        resting = _status("VmRSS")
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # VmHWM from here: the DPO step's own peak
        t = time.perf_counter()
        trainer.dpo_step(pairs)
        return {
            "seconds": time.perf_counter() - t,
            "loaded_mib": loaded,
            "peak_mib": _status("VmHWM"),
            "resting_mib": resting,
        }
    if a.one == "features":
        import learner.reward_model

        if a.peer:  # the LM head on every token, as before
            learner.reward_model.last_logits_only = lambda model: {}
        learner.reward_model.features(
            trainer.model, [p for p, _ in rows], [c for _, c in rows], tok.pad_token_id or 0
        )
    elif a.one == "pg":
        trainer.step(samples)
    else:
        trainer.dpo_step(pairs)
    return {
        "seconds": time.perf_counter() - t,
        "loaded_mib": loaded,
        "peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def _status(field: str) -> float:
    """A field of Linux's /proc/self/status in MiB (VmRSS: resident now; VmHWM: its peak)."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":")) / 1024


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument(
        "--ops",
        default="pg,dpo,features",
        help="passes measured, comma-separated: pg, dpo, features, pg-dpo",
    )
    p.add_argument("--prompt", type=int, default=740, help="prompt tokens a row")
    p.add_argument("--completion", type=int, default=80, help="completion tokens a row")
    p.add_argument("--rows", type=int, default=8, help="rows (pg) or pairs (dpo) in the step")
    p.add_argument("--distinct", action="store_true", help="no prompt head shared by the rows")
    p.add_argument("--caps", default="", help="other caps (padded tokens a pass), comma-separated")
    p.add_argument("--threads", type=int, default=2, help="torch threads")
    p.add_argument("--cap", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--one", choices=("pg", "dpo", "features", "pg-dpo"), help=argparse.SUPPRESS)
    p.add_argument("--peer", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.one is not None:
        print(json.dumps(one(a)))
        return
    from learner.train_step import TrainConfig

    cap = TrainConfig().micro_batch_tokens
    print(
        f"SmolLM2 fp32 + LoRA, {a.rows} rows of {a.prompt} + {a.completion} tokens "
        f"({'each its own prompt' if a.distinct else 'a shared head'}), "
        f"{a.threads} threads; a process per pass; the cap {cap} padded tokens a pass, the peer "
        "none (8 rows, 4 pairs a pass); features: logits at the last position, the peer at all"
    )
    caps = [int(c) for c in a.caps.split(",") if c]
    for op in a.ops.split(","):
        got = {}
        arms = [("peer", ["--peer"]), ("ours", [])]
        arms += [(f"cap {c}", ["--cap", str(c)]) for c in caps if op in ("pg", "dpo")]
        for name, flags in arms:
            cmd = [sys.executable, __file__, "--one", op, *flags]
            cmd += ["--prompt", str(a.prompt), "--completion", str(a.completion)]
            cmd += ["--rows", str(a.rows), "--threads", str(a.threads)]
            cmd += ["--distinct"] if a.distinct else []
            out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
            got[name] = json.loads(out.strip().splitlines()[-1])
        peer = got["peer"]
        for name, ours in got.items():
            if name == "peer":
                continue
            label = op if name == "ours" else f"{op}, {name}"
            print(
                f"{label:>14s}: peak {ours['peak_mib']:,.0f} MiB vs {peer['peak_mib']:,.0f} the "
                f"peer ({ours['peak_mib'] / peer['peak_mib']:.2f}x; the model loaded "
                f"{peer['loaded_mib']:,.0f}); {ours['seconds']:.1f} s vs {peer['seconds']:.1f} s "
                f"({ours['seconds'] / peer['seconds']:.2f}x)"
            )
            if "resting_mib" in ours:
                print(
                    f"{'':>14s}  resting between the steps {ours['resting_mib']:,.0f} MiB vs "
                    f"{peer['resting_mib']:,.0f} the peer"
                )


if __name__ == "__main__":
    main()
