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
before the calculator's output (the call line) trains on whole-run feedback. `--subrounds` and
`--resample-n` set how much of that free checking a round spends: `arloop learn`'s defaults
unless given (the demo runs fewer to end within 7 minutes; the header says which). They cost
compute, not human events. `--hint-n` sets the hinted runs a labelled prompt gets where none of
its runs solved it (`RoundConfig.hint_n`, 0 by default: off).

TRL: `GRPOTrainer` on prompts rendered exactly as the tutor's first model call (system prompt,
the line tool format's block, the worked example, the scrubbed question: `render_prompt` with
`tool_format="line"`, as the policy server does), `num_generations=group`, the demo's
temperature, completion cap, learning rate and KL weight, 8 completions per optimiser step
(arloop's micro-batch), on-policy (one generation per step), and `max_steps` so that the
reward function scores exactly E completions (counted; `--trl-rewards N`: N a round, its epochs
cycling over the same problems, to give TRL as many checked samples as arloop's verified
sub-rounds take). bf16 and gradient checkpointing off.

The reward (and the held-out metric below) is a first-turn proxy of the two-turn episode: a
completion whose first `CALL calculator: <expr>` line evaluates to the reference answer scores
1 (it assumes the model then copies the tool's result into `#### n`, as the worked example
shows); without a call, a `#### n` equal to the reference scores 1; else 0. Unlike the policy
server, TRL does not stop generating at the end of a call line, so its completions (and their
gradient) include the text the model writes after it; the proxy ignores that text.

Held-out: base, arloop's v1 (its LoRA checkpoint) and TRL's result, in this process, on the
same 120 held-out problems (a stratified draw from the gate's pool), measured as the eval gate
measures (the figure that counts): 8 samples a problem at the serving temperature with the
same seeds for all three policies, in the tutor's first-turn form (its calculator call checked
against the answer; TRL's reward is the same check, so this favours neither). The per-problem
paired difference gives each gain with its 95% interval (`learner.gate.sequential`, one look).
The tutor's whole loop replayed greedily (each call line run through the real calculator, up
to the agent's 3 model calls, the pack's verifier on the last reply) is printed beside it.

Rounds: `--rounds R` (default 1) runs R rounds of each arm, a continuously trained agent:
arloop's demo with R rounds of E visits, each round's problems drawn as the demo draws them
(`round_tasks`), its final champion judged (what its users get; the base when the gate released
nothing); TRL's GRPO on the same problems, round by round, each round continuing from its own
previous result (the previous LoRA merged, a new one of the same shape on top), E rewards a
round, R x E in all. Each of arloop's gates draws its tasks from its champion (`arloop learn`'s
default), not from v0 as the demo's do to reuse runs: a later candidate is not judged on the
tasks that released its parent.

Runs: `--draws 3 --seeds 2` (default) cross three draws of training problems with two seeds
(the users' sampling and noise for arloop, TRL's own seed); the summary gives each run's gain
over the base and the mean gain over runs with a t interval (the spread of training).

`--medical` instead runs the medical arm: one demo round of simulated patients with the
triage assistant, then its gate (greedy whole runs through the agent on the held-out cases:
the triage agent samples greedily), and prints the triage level accuracy of v0 and v1, the
model's own answers (before any envelope), whatever it shows.

Usage: .venv/bin/python bench/bench_tutoring_learning.py [--episodes 48] [--group 4]
       [--model smollm2|tiny] [--draws 3] [--seeds 2] [--samples 8] [--held-out 120]
       [--first-draw 0] [--first-seed 0] [--rounds 1] [--subrounds N] [--resample-n N]
       [--hint-n N] [--trl-rewards N]
       [--threads N] [--reuse DATA_DIR]
       [--medical]
"""

from __future__ import annotations

import argparse
import os
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
from trl_config import grpo_args, lora_config  # bench/ is the script's folder: on sys.path
from tutoring_eval import (  # bench/ is the script's folder: on sys.path first
    check_tokens,
    first_call_prompt,
    fmt_gain,
    gain,
    held_out,
    held_out_tasks,
    pct,
    proxy_score,
    sampled,
    solved_rate,
    summary,
)

from agents.events import STREAM_FEEDBACK
from agents.packs.base import Task
from agents.packs.tutoring import tutoring_pack
from deploy.demo import run as demo
from deploy.demo.report import eval_outcomes
from deploy.settings import ModelSettings
from learner.config import RoundConfig
from learner.policy.models import apply_lora, load_base
from learner.policy.registry import CHAMPION, PolicyRegistry
from learner.train_step import TrainConfig

MODEL_CACHE = ModelSettings().model_cache  # ARLOOP_MODEL_CACHE, as the processes read it

LEARN_ROUND = RoundConfig()  # `arloop learn`'s round: its verified sub-rounds, not the demo's
LORA = TrainConfig()  # arloop's adapter shape: the defaults LearnerSettings nests
MICRO_BATCH = 8  # the demo's ARLOOP_TRAIN__MICRO_BATCH_SIZE: completions per optimiser update


def guard_figure(report: dict | None, name: str) -> float:
    """A gate report's figure for one guard (nan when the report or the guard is missing)."""
    guards = (report or {}).get("guards") or []
    figure = next((g.get("figure") for g in guards if g.get("name") == name), None)
    return float("nan") if figure is None else float(figure)


# -- arm 1: arloop, the whole loop ---------------------------------------------------------------


def verified_budget(opts: demo.DemoOptions) -> str:
    return (
        f"{opts.subrounds} verified sub-round(s) x {opts.resample_n} runs a labelled prompt, "
        f"{opts.hint_n} hinted where none solved it"
    )


def arloop_arm(opts: demo.DemoOptions) -> tuple[demo.Report, dict, float]:
    """(demo report, gate outcomes version -> task id -> (solved, tokens), wall seconds).

    The gate dict also holds `"metrics"` (v1's round metrics: reward sources, sub-rounds) and
    `"feedback"` (human feedback events the round saw), read before Redis stops.
    """
    gate: dict = {}
    build = demo.build_report

    def build_and_keep(
        client, pack, improvement=None
    ):  # the per-task gate outcomes, read before Redis stops
        gate.update(eval_outcomes(client, pack))
        versions = {v.version: v for v in PolicyRegistry(client).versions()}
        gate["metrics"] = dict(versions["v1"].metrics) if "v1" in versions else {}
        gate["all_metrics"] = {v: dict(r.metrics) for v, r in versions.items() if r.metrics}
        gate["champion"] = PolicyRegistry(client).aliases().get(CHAMPION, "v0")
        gate["reports"] = {v: r.report for v, r in versions.items() if r.report}
        gate["feedback"] = client.xlen(STREAM_FEEDBACK)
        return build(client, pack, improvement)

    demo.build_report = build_and_keep
    start = time.perf_counter()
    try:
        report, _ = demo.run_demo(opts, Console())
    finally:
        demo.build_report = build
    return report, gate, time.perf_counter() - start


# -- arm 2: TRL's GRPOTrainer ---------------------------------------------------------------------


def trl_arm(
    opts: demo.DemoOptions,
    train: list[Task],
    tokenizer,
    model: torch.nn.Module | None = None,
    rewards: int | None = None,
) -> tuple[torch.nn.Module, dict]:
    """(merged policy after TRL's GRPO on exactly `rewards` rewards, figures; default
    `opts.episodes`, one a human visit); from `model` (a previous round's merged result) when
    given, else from the base. More rewards than problems' tries: its epochs cycle over them."""
    rewards = rewards or opts.episodes
    from datasets import Dataset
    from trl import GRPOTrainer

    batch = MICRO_BATCH if MICRO_BATCH % opts.group == 0 else opts.group
    if opts.episodes % batch or rewards % batch:
        raise SystemExit(
            f"--episodes and --trl-rewards must be multiples of {batch} (completions per TRL step)"
        )
    by_id = {t.id: t for t in train}  # visit_tasks repeats each problem `group` times
    problems = list(by_id.values())
    scored: list[float] = []

    def reward(completions, task_id, **_):
        out = [proxy_score(by_id[i], c) for c, i in zip(completions, task_id, strict=True)]
        scored.extend(out)
        return out

    prompts = [first_call_prompt(tokenizer, t.input) for t in problems]
    check_tokens(tokenizer, prompts[0], problems[0])
    data = Dataset.from_dict({"prompt": prompts, "task_id": [t.id for t in problems]})
    args = grpo_args(
        LORA,
        per_device_train_batch_size=batch,
        gradient_accumulation_steps=1,
        steps_per_generation=1,
        num_generations=opts.group,
        num_iterations=1,
        max_steps=rewards // batch,
        learning_rate=opts.learning_rate,
        warmup_steps=0,
        weight_decay=0.0,
        beta=opts.kl_coef,
        scale_rewards="batch",
        temperature=opts.temperature,
        top_p=1.0,
        max_completion_length=opts.max_tokens,
        seed=opts.seed,
    )
    peft_config = lora_config(LORA)
    if model is None:
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
    if len(scored) != rewards:
        raise RuntimeError(f"TRL scored {len(scored)} completions, not {rewards}")
    figures = {
        "seconds": seconds,
        "rewards": len(scored),
        "steps": trainer.state.global_step,
        "train_reward": sum(scored) / len(scored),
    }
    return trainer.model.merge_and_unload().eval(), figures


def _options(a: argparse.Namespace, work: Path) -> demo.DemoOptions:
    opts = demo.DemoOptions(
        rounds=a.rounds, model=a.model, data_dir=work / "data", report_dir=work / "reports"
    )
    opts = demo.quick(opts) if a.model == "tiny" else opts  # the tiny model's completion cap
    # a round's training and gate can take well over the demo's 15 minutes on a busy machine
    return replace(
        opts,
        rounds=a.rounds,  # after `quick`, which sets its own
        episodes=a.episodes,
        group=a.group,
        phase_timeout_s=3600.0,
        closing_visit=False,
        subrounds=a.subrounds,
        resample_n=a.resample_n,
        hint_n=a.hint_n,
        fresh_draw=True,  # each later gate on its champion's draw, as every run here measured
    )


def one_run(a: argparse.Namespace, draw: int, seed: int, base_seen: dict) -> dict:
    """One problem draw and seed: both arms, the held-out tables; the run's figures.

    `base_seen` keeps the base's held-out outcomes from the first run for the later ones.
    """
    work = Path(tempfile.mkdtemp(prefix="arloop-bench-tutoring-"))
    opts = replace(_options(a, work), seed=seed, draw=draw)
    pack = tutoring_pack("templates", opts.eval_size)
    rounds = [demo.round_tasks(opts, pack, r) for r in range(1, opts.rounds + 1)]
    evals = held_out_tasks(pack, a.held_out)
    print(
        f"\n=== draw {draw}, seed {seed}: model {opts.model}; {opts.rounds} round(s), each "
        f"{opts.episodes} human feedback visits ({opts.episodes // opts.group} problems x "
        f"{opts.group}); "
        f"{len(evals)} held-out x {a.samples} samples at T {opts.temperature}; lr "
        f"{opts.learning_rate}, KL {opts.kl_coef}, max_tokens {opts.max_tokens}; arloop: "
        f"{verified_budget(opts)}; TRL: {a.trl_rewards or opts.episodes} exact rewards a "
        f"round; torch "
        f"{torch.__version__}, {torch.get_num_threads()} threads in-process; work dir {work}"
    )
    report, gate, arloop_s = arloop_arm(opts) if a.reuse is None else (None, {}, 0.0)
    data_dir = a.reuse or opts.data_dir
    _, tokenizer = load_base(opts.model, cache_dir=MODEL_CACHE)
    trl_model, trl = None, {"seconds": 0.0, "rewards": 0, "steps": 0}
    for r, train in enumerate(rounds, 1):  # each round on from the last, its seed its own
        trl_model, figures = trl_arm(
            replace(opts, seed=seed + 1000 * (r - 1)), train, tokenizer, trl_model, a.trl_rewards
        )
        trl = {k: trl[k] + figures[k] for k in trl}
    final = gate.get("champion", "v1") if opts.rounds > 1 else "v1"

    t = time.perf_counter()
    base_model = load_base(opts.model, cache_dir=MODEL_CACHE)[0]
    policies = {  # arloop's final champion: the base when the gate released nothing
        "arloop": base_model
        if final == "v0"
        else apply_lora(base_model, data_dir / f"checkpoints/{final}"),
        "TRL GRPO": trl_model,
    }
    if not base_seen:  # the base's outcomes depend on neither draw nor seed: measured once
        policies = {"base (v0)": load_base(opts.model, cache_dir=MODEL_CACHE)[0], **policies}
    outcomes = {
        k: sampled(m.eval(), tokenizer, evals, a.samples, opts.temperature, opts.max_tokens)
        for k, m in policies.items()
    }
    loops = {k: held_out(m, tokenizer, evals, opts.max_tokens)[1] for k, m in policies.items()}
    eval_s = time.perf_counter() - t
    if not base_seen:
        base_seen.update(outcomes=outcomes["base (v0)"], loops=loops["base (v0)"])
    outcomes["base (v0)"], loops["base (v0)"] = base_seen["outcomes"], base_seen["loops"]

    base = outcomes["base (v0)"]
    gains = {k: gain(base, outcomes[k]) for k in ("arloop", "TRL GRPO")}
    gap = gain(outcomes["TRL GRPO"], outcomes["arloop"])
    print(f"\nheld-out, the gate's sampled first-turn form ({len(evals)} x {a.samples}):")
    print(f"{'policy':11s} {'rewards':>8s} {'success':>8s}   gain over base (95%)   loop replayed")
    if opts.rounds > 1:
        print(f"(arloop's row is its final champion after {opts.rounds} rounds: {final})")
    human_budget = opts.episodes * opts.rounds
    budget = {"base (v0)": "-", "arloop": str(human_budget), "TRL GRPO": str(trl["rewards"])}
    for name in budget:  # base, arloop, TRL
        rate = statistics.fmean(statistics.fmean(row) for row in outcomes[name])
        shown = fmt_gain(gains[name]) if name in gains else "-"
        print(
            f"{name:11s} {budget[name]:>8s} {rate:8.0%}   {shown:>22s}   {solved_rate(loops[name])}"
        )
    print(
        f"arloop - TRL (paired): {fmt_gain(gap)}; outcome correlation with the base: arloop "
        f"{gains['arloop']['corr'] or 0:.2f}, TRL {gains['TRL GRPO']['corr'] or 0:.2f}"
    )
    if report is not None:
        print(f"gate: {demo.headline(report)}")
        v1 = next((r for r in report.versions if r.version == "v1"), None)
        if v1:
            print(f"gate verdict on v1: {v1.verdict}: {v1.reason}")

    m = gate.get("metrics", {})
    every = gate.get("all_metrics", {}).values()  # each round's version, released or not
    evaluations = sum(v.get("reward_sources/verified", 0.0) for v in every) or m.get(
        "reward_sources/verified", 0.0
    )
    human = gate.get("feedback", 0)
    secs = report.seconds if report else {}
    shown = f"{arloop_s:.0f} s" if report else "reused, not timed"
    print(
        f"wall: arloop demo, {opts.rounds} round(s), {shown} (traffic {secs.get('traffic', 0):.0f}, learn+gate "
        f"{secs.get('learn+gate', 0):.0f}); TRL train() {trl['seconds']:.0f} s "
        f"({trl['steps']} steps); in-process eval {eval_s:.0f} s"
    )
    print(
        f"arloop's rounds: {human} human feedback events; v1's labels {m.get('labels', 0):.0f} "
        f"(replayed {m.get('labels/replayed', 0):.0f}); {evaluations:.0f} verified reward "
        f"evaluations ({evaluations / human if human else 0:.1f} per human event); sub-rounds "
        f"solved {pct(m.get('subround/solved_first'))} -> {pct(m.get('subround/solved_last'))}"
        f", hinted runs kept {m.get('subround/hinted_kept', 0):.0f} of "
        f"{m.get('subround/hinted', 0):.0f}"
        f"; KTO answers {m.get('reward_sources/kto_judged', 0):.0f}; reward model "
        f"AUROC {m.get('reward_model/auroc', float('nan')):.2f}; learner peak RSS "
        f"{m.get('memory/peak_rss_mb', float('nan')):.0f} MiB"
    )
    verdicts = {v: (r or {}).get("verdict", "-") for v, r in gate.get("reports", {}).items()}
    for version, vm in sorted(gate.get("all_metrics", {}).items()) if opts.rounds > 1 else ():
        print(
            f"  {version} ({verdicts.get(version, '-')}): labels {vm.get('labels', 0):.0f}, "
            f"verified evaluations {vm.get('reward_sources/verified', 0):.0f}, KTO answers "
            f"{vm.get('reward_sources/kto_judged', 0):.0f}, reward-model scored "
            f"{vm.get('reward_sources/reward_model', 0):.0f} (AUROC "
            f"{vm.get('reward_model/auroc', float('nan')):.2f}), entropy / v0's "
            f"{guard_figure(gate.get('reports', {}).get(version), 'entropy_floor'):.2f}"
        )
    return {
        "draw": draw,
        "seed": seed,
        "base": gains["arloop"]["base"],
        "arloop": gains["arloop"],
        "trl": gains["TRL GRPO"],
        "gap": gap,
        "arloop_s": arloop_s,
        "trl_s": trl["seconds"],
        "per_human": evaluations / human if human else 0.0,
        "loops": {k: statistics.fmean(v) for k, v in loops.items()},
    }


def medical_arm(a: argparse.Namespace) -> None:
    """One round of simulated patients with the triage assistant, then its gate: the level
    accuracy of v0 and v1 on the held-out cases (the model's own answers), whatever it shows."""
    work = Path(tempfile.mkdtemp(prefix="arloop-bench-triage-"))
    opts = replace(_options(a, work), pack="medical", eval_size=1000, seed=a.first_seed)
    print(
        f"\n=== medical arm: model {opts.model}; {opts.episodes} patients' visits "
        f"({opts.episodes // opts.group} messages x {opts.group}); work dir {work}"
    )
    report, gate, seconds = arloop_arm(opts)
    verdicts = gate.get("reports", {})
    v1 = verdicts.get("v1") or {}
    s = v1.get("sequential") or {}
    if not s:
        print(f"no gate report for v1: {v1.get('reason', 'the round published nothing')}")
        return
    n = s["looks"][-1]["tasks"]
    print(
        f"held-out triage cases ({n}, greedy whole runs through the agent, the model's own "
        f"answer, exact level = solved): v0 {s['champion_rate']:.0%} -> v1 "
        f"{s['candidate_rate']:.0%}, diff {s['diff']:+.3f} (95% interval "
        f"{s['ci_low']:+.3f}..{s['ci_high']:+.3f}); gate: {v1.get('verdict')}: "
        f"{v1.get('reason', '')}"
    )
    flags = v1.get("red_flags") or {}
    if flags:
        said = ", ".join(f"{v} {a_}/{b}" for v, (a_, b) in flags.items())
        print(f"red-flag cases the model escalated by itself (guard subset): {said}")
    m = gate.get("metrics", {})
    print(
        f"the round: {gate.get('feedback', 0)} feedback events, labels "
        f"{m.get('labels', 0):.0f} (replayed {m.get('labels/replayed', 0):.0f}); wall "
        f"{seconds:.0f} s (traffic, round and gate)"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--episodes", type=int, default=48, help="human feedback visits per arm")
    ap.add_argument("--group", type=int, default=4, help="tries per training problem")
    ap.add_argument("--held-out", type=int, default=120, help="held-out problems (a fixed draw)")
    ap.add_argument("--samples", type=int, default=8, help="samples a held-out problem")
    ap.add_argument("--model", choices=("smollm2", "tiny"), default="smollm2")
    ap.add_argument("--draws", type=int, default=3, help="draws of training problems")
    ap.add_argument("--seeds", type=int, default=2, help="seeds per draw (both arms)")
    ap.add_argument("--first-seed", type=int, default=0)
    ap.add_argument(
        "--first-draw",
        type=int,
        default=0,
        help="the first draw's number (a long matrix split across invocations)",
    )
    ap.add_argument("--rounds", type=int, default=1, help="rounds of each arm (E visits each)")
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
    ap.add_argument(
        "--subrounds",
        type=int,
        default=LEARN_ROUND.subrounds,
        help="arloop's verified sub-rounds a round (default: `arloop learn`'s, not the demo's)",
    )
    ap.add_argument(
        "--resample-n",
        type=int,
        default=LEARN_ROUND.resample_n,
        help="runs of a labelled prompt in each sub-round (default: `arloop learn`'s)",
    )
    ap.add_argument(
        "--hint-n",
        type=int,
        default=LEARN_ROUND.hint_n,
        help="hinted runs of a labelled prompt no run solved, a sub-round (default: `arloop "
        "learn`'s, 0: no hints)",
    )
    ap.add_argument(
        "--trl-rewards",
        type=int,
        default=0,
        help="exact rewards TRL scores a round (0: --episodes, one a human visit); arloop's "
        "verified evaluations a round, to give TRL the same checked samples",
    )
    ap.add_argument("--medical", action="store_true", help="the medical arm only")
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    if a.medical:
        medical_arm(a)
        return
    draws = range(a.first_draw, a.first_draw + a.draws)
    runs = [(d, a.first_seed + s) for d in draws for s in range(a.seeds)]
    results, base_seen = [], {}
    for draw, seed in runs[:1] if a.reuse else runs:
        results.append(one_run(a, draw, seed, base_seen))
        summary(results)  # after each run: a long bench that is cut short still reports


if __name__ == "__main__":
    main()
