"""Learning efficiency on the tutoring pack: arloop's online loop vs TRL 1.16's GRPOTrainer.

Both start from the same base model (SmolLM2-135M-Instruct, fp32, CPU) with a LoRA of the same
shape (arloop's `TrainConfig`: r=16, alpha=32, every linear layer of a block) and get the same
budget: E reward evaluations on the same E/group training problems, `group` tries each.

arloop: `run_demo` with one round. E simulated students bring those problems to the tutor
over HTTP (Redis, policy server, agent API, learner: the real processes); each visit is one
human feedback event's worth of budget. Students are noisy (5% of judgements flipped), 10%
stay silent, some send a correction. The learner turns their feedback into rewards and, where
it agrees enough, into labels (a thumbs-up on a `#### n` answer, a correction's number); the
labelled prompts are resampled in verified on-policy sub-rounds from the weights in training,
through the real calculator, and checked against the label (those checks are the extra
"reward evaluations" the summary counts per human event). As in the demo, only the turn
before the calculator's output (the call line) trains on whole-run feedback.

TRL: `GRPOTrainer` on prompts rendered exactly as the tutor's first model call (system prompt,
the line tool format's block, the worked example, the scrubbed question: `render_prompt` with
`tool_format="line"`, as the policy server does), `num_generations=group`, the demo's
temperature, completion cap, learning rate and KL weight, 8 completions per optimiser step
(arloop's micro-batch), on-policy (one generation per step), and `max_steps` so that the
reward function scores exactly E completions (counted). bf16 and gradient checkpointing off.

The reward (and the held-out metric below) is a first-turn proxy of the two-turn episode: a
completion whose first `CALL calculator: <expr>` line evaluates to the reference answer scores
1 (it assumes the model then copies the tool's result into `#### n`, as the worked example
shows); without a call, a `#### n` equal to the reference scores 1; else 0. Unlike the policy
server, TRL does not stop generating at the end of a call line, so its completions (and their
gradient) include the text the model writes after it; the proxy ignores that text.

Held-out: base, arloop's v1 (its LoRA checkpoint) and TRL's result on the same held-out
problems, greedy, in this process, scored twice: with the proxy, and by replaying the tutor's
loop (each call line run through the real calculator, its result fed back as a `tool` turn, up
to the agent's 3 model calls, the pack's verifier on the last reply), the figure that counts
for a tutor and one TRL's reward never saw. Wilson 95% intervals, and paired differences
(Newcombe 95% interval, exact McNemar p) against the base and between the two learners. The
gate's own agent-graph figures for v0 and v1 (over HTTP, from the demo) are printed beside
them: the replay should come close to them (batched padding can flip a near tie). One seed,
one run: the intervals cover the held-out sample, not the run-to-run spread of training.

Runs: `--runs 6` (default) runs seeds 0..5, each its own draw of training problems and its
own sampling seeds for both arms; the summary gives each run's gain over the base (paired,
Newcombe 95%) and the mean gain over runs with a t interval (the spread of training).

Usage: .venv/bin/python bench/bench_tutoring_learning.py [--episodes 48] [--group 4]
       [--eval-size 60] [--model smollm2|tiny] [--runs 6] [--first-seed 0] [--threads N]
       [--reuse DATA_DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import statistics
import tempfile
import time
import warnings
from dataclasses import replace
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("TLDEXTRACT_PUBLIC_SUFFIX_LIST_URLS", "")
warnings.filterwarnings("ignore")
import transformers

transformers.logging.set_verbosity_error()
transformers.logging.disable_progress_bar()

import torch
from rich.console import Console

from agents.events import STREAM_FEEDBACK
from agents.packs.base import Task
from agents.packs.tutoring import tutor, tutoring_pack, verify
from agents.react import BUDGET_NOTE
from agents.run_context import to_openai
from deploy.demo import run as demo
from deploy.demo.report import eval_outcomes
from deploy.demo.rounds import round_tasks
from deploy.settings import ModelSettings
from learner.gate.stats import PairedComparison, paired_comparison, wilson
from learner.policy.chat_format import LINE, parse_tool_calls, prompt_token_ids, render_prompt
from learner.policy.models import apply_lora, load_base
from learner.policy.registry import PolicyRegistry
from learner.train_step import TrainConfig
from tools.base import ToolError
from tools.calculator import calculate
from tools.registry import ToolRegistry

MODEL_CACHE = ModelSettings().model_cache  # ARLOOP_MODEL_CACHE, as the processes read it

LORA = TrainConfig()  # arloop's adapter shape: the defaults LearnerSettings nests
MICRO_BATCH = 8  # the demo's ARLOOP_TRAIN__MICRO_BATCH_SIZE: completions per optimiser update
TUTOR = tutor()
TOOLS = [t.spec() for t in TUTOR.tools]
REGISTRY = ToolRegistry(TUTOR.tools)


# -- the tutor's first model call and the proxy reward -------------------------------------------


def first_call_messages(question: str) -> list[dict]:
    """The messages of the tutor's first policy call, as the agent graph sends them."""
    from langchain_core.messages import HumanMessage

    text = TUTOR.input_filter(question) if TUTOR.input_filter else question
    return to_openai([HumanMessage(text)], TUTOR.system_prompt, list(TUTOR.examples))


def first_call_prompt(tokenizer, question: str) -> str:
    """The prompt text the policy server renders for that call (line tool format)."""
    return render_prompt(tokenizer, first_call_messages(question), TOOLS, LINE)


def proxy_score(task: Task, completion: str) -> float:
    """1.0 when the first turn's calculator call (else its `#### n`) gives the reference answer."""
    _, calls = parse_tool_calls(completion, TOOLS, LINE)
    if not calls:
        return verify(task, completion)
    fn = calls[0]["function"]  # the server stops after the first call line
    if fn["name"] != "calculator":
        return 0.0
    try:
        value = calculate(json.loads(fn["arguments"]).get("expression", ""))
    except (ToolError, AttributeError, json.JSONDecodeError):
        return 0.0
    return verify(task, f"#### {value}")


# -- arm 1: arloop, the whole loop ---------------------------------------------------------------


def arloop_arm(opts: demo.DemoOptions) -> tuple[demo.Report, dict, float]:
    """(demo report, gate outcomes version -> task id -> (solved, tokens), wall seconds).

    The gate dict also holds `"metrics"` (v1's round metrics: reward sources, sub-rounds) and
    `"feedback"` (human feedback events the round saw), read before Redis stops.
    """
    gate: dict = {}
    build = demo.build_report

    def build_and_keep(client, pack):  # the per-task gate outcomes, read before Redis stops
        gate.update(eval_outcomes(client, pack))
        versions = {v.version: v for v in PolicyRegistry(client).versions()}
        gate["metrics"] = dict(versions["v1"].metrics) if "v1" in versions else {}
        gate["feedback"] = client.xlen(STREAM_FEEDBACK)
        return build(client, pack)

    demo.build_report = build_and_keep
    start = time.perf_counter()
    try:
        report, _ = demo.run_demo(opts, Console())
    finally:
        demo.build_report = build
    return report, gate, time.perf_counter() - start


# -- arm 2: TRL's GRPOTrainer ---------------------------------------------------------------------


def trl_arm(opts: demo.DemoOptions, train: list[Task], tokenizer) -> tuple[torch.nn.Module, dict]:
    """(merged policy after TRL's GRPO on exactly `opts.episodes` rewards, figures)."""
    from datasets import Dataset
    from peft import LoraConfig
    from trl import GRPOConfig, GRPOTrainer

    batch = MICRO_BATCH if MICRO_BATCH % opts.group == 0 else opts.group
    if opts.episodes % batch:
        raise SystemExit(f"--episodes must be a multiple of {batch} (completions per TRL step)")
    by_id = {t.id: t for t in train}  # round_tasks repeats each problem `group` times
    problems = list(by_id.values())
    scored: list[float] = []

    def reward(completions, task_id, **_):
        out = [proxy_score(by_id[i], c) for c, i in zip(completions, task_id, strict=True)]
        scored.extend(out)
        return out

    prompts = [first_call_prompt(tokenizer, t.input) for t in problems]
    _check_tokens(tokenizer, prompts[0], problems[0])
    data = Dataset.from_dict({"prompt": prompts, "task_id": [t.id for t in problems]})
    args = GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="arloop-trl-"),
        per_device_train_batch_size=batch,
        gradient_accumulation_steps=1,
        steps_per_generation=1,
        num_generations=opts.group,
        num_iterations=1,
        max_steps=opts.episodes // batch,
        learning_rate=opts.learning_rate,
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=0.0,
        max_grad_norm=LORA.max_grad_norm,
        beta=opts.kl_coef,
        epsilon=LORA.clip_eps,
        loss_type="dapo",
        scale_rewards="batch",
        use_bias_correction_kl=False,
        temperature=opts.temperature,
        top_p=1.0,
        max_completion_length=opts.max_tokens,
        bf16=False,
        gradient_checkpointing=False,
        use_cpu=True,
        report_to="none",
        logging_steps=1,
        save_strategy="no",
        disable_dropout=True,
        optim="adamw_torch",
        seed=opts.seed,
        dataloader_num_workers=0,
        disable_tqdm=True,
    )
    peft_config = LoraConfig(
        r=LORA.lora_rank,
        lora_alpha=LORA.lora_alpha,
        lora_dropout=0.0,
        target_modules=list(LORA.lora_targets),
        task_type="CAUSAL_LM",
    )
    model, _ = load_base(opts.model, cache_dir=MODEL_CACHE)
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=reward,
        args=args,
        train_dataset=data,
        processing_class=tokenizer,
        peft_config=peft_config,
    )
    start = time.perf_counter()
    trainer.train()
    seconds = time.perf_counter() - start
    if len(scored) != opts.episodes:
        raise RuntimeError(f"TRL scored {len(scored)} completions, not {opts.episodes}")
    figures = {
        "seconds": seconds,
        "rewards": len(scored),
        "steps": trainer.state.global_step,
        "train_reward": sum(scored) / len(scored),
    }
    return trainer.model.merge_and_unload().eval(), figures


def _check_tokens(tokenizer, prompt: str, task: Task) -> None:
    """TRL tokenises a text prompt itself: it must give the policy server's token ids."""
    trl_ids = tokenizer(text=prompt)["input_ids"]
    server_ids = prompt_token_ids(tokenizer, first_call_messages(task.input), TOOLS, LINE)
    if list(trl_ids) != server_ids:
        raise RuntimeError("TRL's prompt tokens differ from the policy server's")


# -- held-out: greedy, batched, in-process ----------------------------------------------------------


def held_out(model, tokenizer, tasks: list[Task], max_tokens: int) -> tuple[list[int], list[int]]:
    """1/0 per task: (the first-turn proxy, the tutor's ReAct loop replayed here), greedy.

    The replay follows the graph: one call line per turn (the server stops there), the real
    calculator's observation as a `tool` turn, at most `max_steps` model calls, and the pack's
    verifier on the last reply.
    """
    threads = [first_call_messages(t.input) for t in tasks]
    final: list[str | None] = [None] * len(tasks)
    proxy: list[int] = []
    for turn in range(TUTOR.max_steps):
        live = [i for i, out in enumerate(final) if out is None]
        if not live:
            break
        texts = _greedy(model, tokenizer, [threads[i] for i in live], max_tokens)
        if turn == 0:
            proxy = [int(proxy_score(t, x) >= 1.0) for t, x in zip(tasks, texts, strict=True)]
        for i, text in zip(live, texts, strict=True):
            content, calls = parse_tool_calls(text, TOOLS, LINE)
            if not calls:
                final[i] = text
            elif turn == TUTOR.max_steps - 1:
                final[i] = BUDGET_NOTE
            else:
                threads[i] += _tool_turn(content, calls[0])
    return proxy, [int(verify(t, out or "") >= 1.0) for t, out in zip(tasks, final, strict=True)]


def _tool_turn(content: str | None, call: dict) -> list[dict]:
    fn = call["function"]
    result = asyncio.run(REGISTRY.call(fn["name"], fn["arguments"], call["id"]))
    said = {"content": content} if content else {}
    return [
        {"role": "assistant", **said, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": call["id"], "content": result.output},
    ]


def _greedy(model, tokenizer, threads: list[list[dict]], max_tokens: int, size: int = 16):
    """Greedy replies to chat threads, rendered as the policy server renders them."""
    out = []
    pad = tokenizer.pad_token_id
    for i in range(0, len(threads), size):
        ids = [prompt_token_ids(tokenizer, m, TOOLS, LINE) for m in threads[i : i + size]]
        width = max(len(p) for p in ids)
        batch = torch.tensor([[pad] * (width - len(p)) + p for p in ids])  # (B, T) left-padded
        attn = (torch.arange(width) >= torch.tensor([width - len(p) for p in ids])[:, None]).long()
        with torch.no_grad():
            seqs = model.generate(
                input_ids=batch,
                attention_mask=attn,
                do_sample=False,
                max_new_tokens=max_tokens,
                pad_token_id=pad,
                temperature=None,
                top_p=None,
                top_k=None,
            )
        out += tokenizer.batch_decode(seqs[:, width:], skip_special_tokens=True)  # (B, new)
    return out


# -- the run ------------------------------------------------------------------------------------------


def _rate(outcomes: list[int]) -> str:
    k, n = sum(outcomes), len(outcomes)
    low, high = wilson(k, n)
    return f"{k}/{n} = {k / n:.0%} [{low:.0%}, {high:.0%}]"


def _diff(c: PairedComparison) -> str:
    return f"{c.diff:+.3f} [{c.ci_low:+.3f}, {c.ci_high:+.3f}] p_worse={c.p_worse:.3f}"


def _gate_figures(report: demo.Report, gate: dict) -> None:
    print("\narloop, agent graph (the gate's greedy runs through the real tutor, up to 3 calls):")
    for v in ("v0", "v1"):
        outcomes = [int(s) for s, _ in gate.get(v, {}).values()]
        row = next((r for r in report.versions if r.version == v), None)
        verdict = f"  gate: {row.verdict} {row.reason}" if row and v != "v0" else ""
        print(f"  {v}: {_rate(outcomes) if outcomes else '-'}{verdict}")
    ids = sorted(set(gate.get("v0", {})) & set(gate.get("v1", {})))
    if ids:
        c = paired_comparison(
            [int(gate["v0"][i][0]) for i in ids], [int(gate["v1"][i][0]) for i in ids]
        )
        print(f"  v1 - v0 (paired): {_diff(c)}")
    print(f"  headline: {demo.headline(report)}")


def _table(title: str, outcomes: dict[str, list[int]], budget: dict[str, str]) -> PairedComparison:
    """One metric's table; returns arloop v1 - TRL (paired)."""
    base = outcomes["base (v0)"]
    print(f"\n{title}")
    print(f"{'policy':11s} {'rewards':>16s} {'held-out (Wilson 95%)':>26s}   vs base (paired, 95%)")
    for name, res in outcomes.items():
        vs = "-" if res is base else _diff(paired_comparison(base, res))
        print(f"{name:11s} {budget[name]:>16s} {_rate(res):>26s}   {vs}")
    gap = paired_comparison(outcomes["TRL GRPO"], outcomes["arloop v1"])
    gains = [sum(outcomes[k]) - sum(base) for k in ("arloop v1", "TRL GRPO")]
    ratio = f"{gains[0] / gains[1]:.2f}" if gains[1] > 0 else "undefined (TRL gained <= 0)"
    print(f"arloop v1 - TRL (paired):  {_diff(gap)}")
    print(
        f"gain over base, in tasks:  arloop {gains[0]:+d}, TRL {gains[1]:+d}; ratio {ratio} "
        "(one run: no interval)"
    )
    return gap


def _options(a: argparse.Namespace, work: Path) -> demo.DemoOptions:
    opts = demo.DemoOptions(
        rounds=1, model=a.model, data_dir=work / "data", report_dir=work / "reports"
    )
    opts = demo.quick(opts) if a.model == "tiny" else opts  # the tiny model's completion cap
    # a round's training and gate can take well over the demo's 15 minutes on a busy machine
    return replace(
        opts,
        episodes=a.episodes,
        group=a.group,
        eval_size=a.eval_size,
        phase_timeout_s=3600.0,
        closing_visit=False,
    )


def one_run(a: argparse.Namespace, seed: int) -> dict:
    """One problem draw and seed: both arms, the held-out tables; the run's figures."""
    work = Path(tempfile.mkdtemp(prefix="arloop-bench-tutoring-"))
    opts = replace(_options(a, work), seed=seed)
    pack = tutoring_pack("templates", opts.eval_size)
    train = round_tasks(
        pack.tasks("train"),
        opts.episodes // opts.group,
        opts.group,
        random.Random(f"{opts.seed}/1"),
    )  # the demo's round 1: the seed draws the problems
    evals = pack.tasks("eval")
    print(
        f"\n=== seed {seed}: model {opts.model}; budget {opts.episodes} human feedback visits "
        f"({opts.episodes // opts.group} problems x {opts.group}); {len(evals)} held-out; "
        f"lr {opts.learning_rate}, KL {opts.kl_coef}, T {opts.temperature}, "
        f"max_tokens {opts.max_tokens}; torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads in-process; work dir {work}"
    )

    report, gate, arloop_s = arloop_arm(opts) if a.reuse is None else (None, {}, 0.0)
    data_dir = a.reuse or opts.data_dir
    v1_row = next((r for r in report.versions if r.version == "v1"), None) if report else None
    _, tokenizer = load_base(opts.model, cache_dir=MODEL_CACHE)
    trl_model, trl = trl_arm(opts, train, tokenizer)

    t = time.perf_counter()
    policies = {
        "base (v0)": load_base(opts.model, cache_dir=MODEL_CACHE)[0],
        "arloop v1": apply_lora(
            load_base(opts.model, cache_dir=MODEL_CACHE)[0], data_dir / "checkpoints/v1"
        ),
        "TRL GRPO": trl_model,
    }
    runs = {k: held_out(m.eval(), tokenizer, evals, opts.max_tokens) for k, m in policies.items()}
    eval_s = time.perf_counter() - t

    trained = f" ({v1_row.trained_events} trained)" if v1_row else ""
    budget = {
        "base (v0)": "-",
        "arloop v1": f"{opts.episodes}{trained}",
        "TRL GRPO": str(trl["rewards"]),
    }
    gap = _table(
        f"held-out success, first-turn proxy (TRL's reward), greedy, {len(evals)} tasks:",
        {k: r[0] for k, r in runs.items()},
        budget,
    )
    agent_gap = _table(
        "held-out success, the tutor's loop replayed in-process (calculator, "
        "up to 3 calls), greedy:",
        {k: r[1] for k, r in runs.items()},
        budget,
    )
    if report is not None:
        _gate_figures(report, gate)

    m = gate.get("metrics", {})
    evaluations = sum(m.get(k, 0.0) for k in ("reward_sources/verified",))
    human = gate.get("feedback", 0)
    secs = report.seconds if report else {}
    shown = f"{arloop_s:.0f} s" if report else "reused, not timed"
    print(
        f"\nwall: arloop demo {shown} (start {secs.get('start', 0):.0f}, traffic "
        f"{secs.get('traffic', 0):.0f}, learn+gate {secs.get('learn+gate', 0):.0f} incl. the "
        f"gate's v0+v1 evals); TRL train() {trl['seconds']:.0f} s ({trl['steps']} steps); "
        f"in-process eval {eval_s:.0f} s"
    )
    print(
        f"arloop's round: {human} human feedback events; labels {m.get('labels', 0):.0f} "
        f"(replayed {m.get('labels/replayed', 0):.0f}); {evaluations:.0f} verified reward "
        f"evaluations ({evaluations / human if human else 0:.1f} per human event); sub-rounds "
        f"solved {_pct(m.get('subround/solved_first'))} -> {_pct(m.get('subround/solved_last'))}"
        f", generate {m.get('subround/generate_s', 0):.0f} s, update "
        f"{m.get('subround/update_s', 0):.0f} s"
    )
    print(
        f"verdict: after {opts.episodes} visits each, {_verdict(gap)} on the "
        f"first-turn proxy (arloop v1 - TRL {gap.diff:+.3f} [{gap.ci_low:+.3f}, "
        f"{gap.ci_high:+.3f}]) and {_verdict(agent_gap)} on the replayed loop "
        f"({agent_gap.diff:+.3f} [{agent_gap.ci_low:+.3f}, {agent_gap.ci_high:+.3f}])"
    )
    loop = {k: r[1] for k, r in runs.items()}
    base = loop["base (v0)"]
    return {
        "seed": seed,
        "base": sum(base) / len(base),
        "arloop": paired_comparison(base, loop["arloop v1"]),
        "trl": paired_comparison(base, loop["TRL GRPO"]),
        "arloop_s": arloop_s,
        "trl_s": trl["seconds"],
        "per_human": evaluations / human if human else 0.0,
    }


def summary(results: list[dict]) -> None:
    """Per run, and the mean gain over runs with a t interval (the spread of training)."""
    print("\n=== summary over runs (the tutor's loop replayed, greedy, held-out)")
    print(f"{'seed':>4s} {'base':>6s} {'arloop gain (95%, paired)':>34s} {'TRL gain':>34s}")
    for r in results:
        print(f"{r['seed']:>4d} {r['base']:6.0%} {_diff(r['arloop']):>34s} {_diff(r['trl']):>34s}")
    for name in ("arloop", "trl"):
        gains = [r[name].diff for r in results]
        low, high = _t_interval(gains)
        worse = sum(r[name].ci_high < 0 for r in results)
        print(
            f"{name:>6s}: mean gain {statistics.fmean(gains):+.3f} (95% t interval over "
            f"{len(gains)} runs {low:+.3f}..{high:+.3f}); runs significantly worse than base: "
            f"{worse}"
        )
    print(
        f"verified reward evaluations per human event (arloop): "
        f"{statistics.fmean(r['per_human'] for r in results):.1f}; wall per run: arloop "
        f"{statistics.fmean(r['arloop_s'] for r in results):.0f} s (whole demo round incl. "
        f"gate), TRL train() {statistics.fmean(r['trl_s'] for r in results):.0f} s"
    )


def _t_interval(values: list[float]) -> tuple[float, float]:
    if len(values) < 2:
        return math.nan, math.nan
    half = T975[min(len(values) - 1, len(T975)) - 1] * statistics.stdev(values)
    half /= math.sqrt(len(values))
    mean = statistics.fmean(values)
    return mean - half, mean + half


T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228)  # df 1..10


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.0%}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--episodes", type=int, default=48, help="human feedback visits per arm")
    ap.add_argument("--group", type=int, default=4, help="tries per training problem")
    ap.add_argument("--eval-size", type=int, default=60, help="held-out problems")
    ap.add_argument("--model", choices=("smollm2", "tiny"), default="smollm2")
    ap.add_argument(
        "--runs", type=int, default=6, help="runs, seeds 0..runs-1: each its own problem draw"
    )
    ap.add_argument("--first-seed", type=int, default=0)
    ap.add_argument(
        "--threads",
        type=int,
        default=0,
        help="torch threads of TRL and the in-process eval (0: torch's default)",
    )
    ap.add_argument(
        "--reuse",
        type=Path,
        default=None,
        help="data dir of an earlier run with the same options (one run): take its v1, skip "
        "the demo (no gate figures, no arloop wall)",
    )
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    seeds = range(a.first_seed, a.first_seed + (1 if a.reuse else a.runs))
    results = []
    for seed in seeds:
        results.append(one_run(a, seed))
        summary(results)  # after each run: a long bench that is cut short still reports


def _verdict(gap: PairedComparison) -> str:
    if gap.ci_low > 0:
        return "arloop ahead"
    return "TRL ahead" if gap.ci_high < 0 else "no detectable difference"


def _num(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


if __name__ == "__main__":
    main()
