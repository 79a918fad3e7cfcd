"""The learner's verified resampling at several batch sizes: seconds and peak memory, same rows.

What a sub-round does (`learner.resample.replay`): labelled prompts, each resampled `--n`
times through the agent's real tools (the tutor's calculator, up to its 3 model calls; with
`--pack medical` the triage agent's knowledge base, 80 tokens a call), from the model the
learner trains (SmolLM2-135M-Instruct, fp32, its LoRA attached as `PolicyTrainer` attaches it),
at the demo's temperature and token budget. The prompts are the agent's first calls on the
demo's first problems (system prompt, worked example, the user's message; line tool format),
the answer each is checked against the problem's reference.

Each batch size runs in a process of its own, so its peak resident memory (`ru_maxrss`) is its
own; the same seeds give every batch size the same rows. The peer is 16 rows a step (the
default before this bench), measured in the same run; `same runs` is the share of runs whose
tokens equal the peer's (batching pads prompts, which can move a float and so a sample).

Shapes: the demo's (`--prompts 10 --n 4`: up to 10 labels x 4 runs) and `arloop learn`'s
(`--prompts 16 --n 8`: `max_resample_prompts` x `resample_n`).
Usage: .venv/bin/python bench/bench_resample.py [--pack tutoring] [--prompts 10] [--n 4]
       [--batch-sizes 16,32,48]
       [--repeats 2] [--threads 2]
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

PEER = 16


def first_calls(pack_name: str, prompts: int, tokenizer):
    """The pack's agent's first calls on the demo's first problems (its rounds' in order), as
    the learner replays them."""
    from langchain_core.messages import HumanMessage

    from agents.events import ModelStep
    from agents.packs import get_pack
    from agents.run_context import to_openai
    from deploy.demo.options import DemoOptions
    from deploy.demo.run import round_tasks
    from deploy.learn.plan import groundings
    from learner.policy.chat_format import prompt_token_ids
    from learner.resample import Start, faithful

    pack = get_pack(pack_name)
    agent = pack.agents[0]
    grounding = groundings([pack], "line")[agent.name]
    specs = [t.spec() for t in agent.tools]
    seen, starts = set(), []
    opts = DemoOptions(pack=pack_name)
    tasks = (task for r in range(1, 1000) for task in round_tasks(opts, pack, r))
    for task in tasks:
        if len(starts) == prompts:
            break
        if task.id in seen:
            continue
        seen.add(task.id)
        messages = to_openai([HumanMessage(task.input)], agent.system_prompt, list(agent.examples))
        step = ModelStep(
            index=0,
            messages=messages,
            tool_names=[t.name for t in agent.tools],
            output="",
            model="arloop",
            policy_version="v0",
            prompt_token_ids=prompt_token_ids(tokenizer, messages, specs, "line"),
            completion_token_ids=[1],
            latency_ms=1.0,
        )
        start = Start(step, grounding, task.reference, key=task.id)
        if not faithful(start, tokenizer):
            raise SystemExit(f"{task.id}: its prompt does not render to its tokens")
        starts.append(start)
    return starts


def one(a: argparse.Namespace) -> dict:
    """One batch size in this process: the replay's seconds per repeat and the peak RSS."""
    import torch

    torch.set_num_threads(a.threads)
    from deploy.settings import ModelSettings
    from learner.policy.models import load_base
    from learner.resample import replay
    from learner.train_step import PolicyTrainer, TrainConfig

    model, tokenizer = load_base("smollm2", cache_dir=ModelSettings().model_cache)
    trainer = PolicyTrainer(model, tokenizer.pad_token_id or 0, TrainConfig())
    starts = first_calls(a.pack, a.prompts, tokenizer)
    loaded = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    seconds, runs = [], []
    for r in range(a.repeats):
        t = time.perf_counter()
        runs = replay(
            trainer.model,
            tokenizer,
            starts,
            n=a.n,
            temperature=0.7,
            max_tokens=32,
            seed=r,
            max_batch_size=a.one,
        )
        seconds.append(time.perf_counter() - t)
    flat = [run for choices in runs for run in choices]
    return {
        "batch": a.one,
        "seconds": seconds,
        "loaded_mib": loaded,
        "peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "rows": len(flat),
        "turns": sum(len(run.turns) for run in flat),
        "tokens": sum(len(t.completion_ids) for run in flat for t in run.turns),
        "solved": sum(run.solved for run in flat) / len(flat),
        "prompt_tokens": sum(len(s.step.prompt_token_ids or []) for s in starts) / len(starts),
        "ids": [[t.completion_ids for t in run.turns] for run in flat],
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--pack", choices=("tutoring", "medical"), default="tutoring")
    p.add_argument("--prompts", type=int, default=10, help="labelled prompts resampled")
    p.add_argument("--n", type=int, default=4, help="runs of each prompt")
    p.add_argument(
        "--batch-sizes", default="16,32,48", help="rows a decoding step, comma-separated"
    )
    p.add_argument("--repeats", type=int, default=2, help="replays per batch size (seeds 0..)")
    p.add_argument("--threads", type=int, default=2, help="torch threads")
    p.add_argument("--one", type=int, default=None, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.one is not None:
        print(json.dumps(one(a)))
        return
    sizes = sorted({int(b) for b in a.batch_sizes.split(",")} | {PEER})
    print(
        f"resampling {a.prompts} labelled {a.pack} prompts x {a.n} runs (T 0.7, the agent's "
        f"tokens a call or 32, its calls), SmolLM2-135M fp32 + LoRA, {a.threads} torch threads, "
        f"{a.repeats} repeats; a process per batch size"
    )
    results = {}
    for b in sizes:
        cmd = [sys.executable, __file__, *sys.argv[1:], "--one", str(b)]
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
        results[b] = json.loads(out.strip().splitlines()[-1])
        r = results[b]
        print(f"  {b} rows a step: {' / '.join(f'{s:.1f}' for s in r['seconds'])} s", flush=True)
    peer = results[PEER]
    print(f"  prompts of {peer['prompt_tokens']:.0f} tokens on average")
    best = min(peer["seconds"])
    print(
        "\n| rows a step | seconds (best) | vs 16 | tokens/s | peak RSS MiB "
        "(loaded) | turns | solved | same runs as 16 |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for b, r in results.items():
        same = sum(x == y for x, y in zip(r["ids"], peer["ids"], strict=True)) / r["rows"]
        s = min(r["seconds"])
        print(
            f"| {b} | {s:.1f} | {best / s:.2f}x | {r['tokens'] / s:.0f} | {r['peak_mib']:.0f} "
            f"({r['loaded_mib']:.0f}) | {r['turns']} | {r['solved']:.0%} | {same:.0%} |"
        )


if __name__ == "__main__":
    main()
