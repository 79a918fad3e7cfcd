"""The demo's report: per policy version, figures read back from Redis and the registry.

Held-out success comes from the eval gate's own whole runs at the serving temperature
(`arloop:eval:trajectories`, tagged with the version, task and form, re-scored with the pack's
verifier), with a Wilson 95% interval; the traffic figures (thumbs-up rate, mean user reward)
from the runs each version served (`arloop:trajectories`) and the feedback on them
(`arloop:feedback`); the gate's verdict and KL(version || base) from the version's report in
the registry; training figures from the round's metrics. The headline is the final champion
against v0 by the gate's own sequential test (`final_comparison`: sampled, coupled runs on
v0's draw, whose runs are cached), with its repeated 95% interval.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import redis

from agents.events import (
    ONE_SHARD,
    STREAM_EVAL_TRAJECTORIES,
    STREAM_SHARDS_KEY,
    FeedbackEvent,
    StreamShards,
    TrajectoryEvent,
    as_text,
    decode,
)
from agents.packs.base import Pack
from learner.gate.evidence import answer_tokens
from learner.gate.stats import wilson
from learner.policy.registry import BASE_VERSION, CHAMPION, PolicyRegistry, PolicyVersion
from learner.rewards import mean_score, scored


@dataclass
class VersionRow:
    """One policy version's line of the report."""

    version: str
    parent: str | None
    status: str
    verdict: str  # pass | reject | base | - (not gated)
    reason: str = ""
    failed: list[str] = field(default_factory=list)
    eval_solved: int = 0
    eval_n: int = 0
    eval_low: float | None = None
    eval_high: float | None = None
    eval_answer_tokens: float | None = None
    traffic_runs: int = 0
    thumbs_up: int = 0
    thumbs_down: int = 0
    user_reward: float | None = None
    train_reward: float | None = None
    train_kl: float | None = None
    kl: float | None = None  # KL(version || base) per token on the eval completions (gate)
    trained_events: int = 0

    @property
    def eval_rate(self) -> float | None:
        return self.eval_solved / self.eval_n if self.eval_n else None

    @property
    def thumbs_up_rate(self) -> float | None:
        n = self.thumbs_up + self.thumbs_down
        return self.thumbs_up / n if n else None


@dataclass
class Report:
    versions: list[VersionRow]
    champion: str
    improvement: dict[str, Any] | None
    feedback_counts: dict[str, int]
    options: dict[str, Any] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    rounds: list[dict[str, Any]] = field(default_factory=list)

    def row(self, version: str) -> VersionRow:
        return next(r for r in self.versions if r.version == version)

    def to_dict(self) -> dict[str, Any]:
        rows = [
            asdict(r) | {"eval_rate": r.eval_rate, "thumbs_up_rate": r.thumbs_up_rate}
            for r in self.versions
        ]
        return {
            "champion": self.champion,
            "improvement": self.improvement,
            "versions": rows,
            "feedback_counts": self.feedback_counts,
            "rounds": self.rounds,
            "options": self.options,
            "seconds": self.seconds,
        }


def read_stream(client: redis.Redis, stream: str) -> list[Any]:
    """Every event of a stream, oldest first."""
    out, start = [], "-"
    while True:
        batch = client.xrange(stream, min=start, count=1000)
        out += [decode(fields) for _, fields in batch]
        if len(batch) < 1000:
            return out
        last = batch[-1][0].decode() if isinstance(batch[-1][0], bytes) else batch[-1][0]
        start = "(" + last


def eval_outcomes(
    client: redis.Redis, pack: Pack, form: str = "sampled"
) -> dict[str, dict[str, tuple[bool, int | None]]]:
    """version -> task id -> (solved, answer tokens), from the gate's whole runs of `form`
    (`sampled`: at the serving temperature, what users get; `greedy`: the guards' runs)."""
    tasks = {t.id: t for t in pack.tasks("eval")}
    out: dict[str, dict[str, tuple[bool, int | None]]] = defaultdict(dict)
    for t in read_stream(client, STREAM_EVAL_TRAJECTORIES):
        task = tasks.get(t.metadata.get("arloop.task", ""))
        if task is not None and t.metadata.get("arloop.form", "greedy") == form:
            solved = float(pack.verify(task, t.model_answer)) >= 1.0  # the model's, not a guard's
            out[t.metadata["arloop.eval"]][task.id] = (solved, answer_tokens(t))
    return out


def logged_shards(client: redis.Redis) -> StreamShards:
    """The shards the demo's processes laid the streams out in (each claims the count in
    `STREAM_SHARDS_KEY` at its start; none there: one)."""
    stored = client.get(STREAM_SHARDS_KEY)
    return ONE_SHARD if stored is None else StreamShards(int(as_text(stored)))


def build_report(
    client: redis.Redis, pack: Pack, improvement: dict[str, Any] | None = None
) -> Report:
    """Every figure of the report, from Redis (every shard's streams) and the registry;
    `improvement` is the final champion against v0 (`final_comparison`), None when there was no
    other champion."""
    shards = logged_shards(client)
    registry = PolicyRegistry(client)
    evals = eval_outcomes(client, pack)
    runs = [
        t
        for stream in shards.all_trajectories()
        for t in read_stream(client, stream)
        if isinstance(t, TrajectoryEvent)
    ]
    feedback = [
        f
        for stream in shards.all_feedback()
        for f in read_stream(client, stream)
        if isinstance(f, FeedbackEvent)
    ]
    by_run: dict[str, list[FeedbackEvent]] = defaultdict(list)
    for f in feedback:
        by_run[f.trajectory_id].append(f)
    rows = [_row(v, evals.get(v.version, {}), runs, by_run) for v in registry.versions()]
    champion = registry.resolve(CHAMPION)
    counts: dict[str, int] = defaultdict(int)
    for f in feedback:
        counts[f.kind.value] += 1
    return Report(rows, champion, improvement, dict(counts))


def _row(v: PolicyVersion, evals, runs: Sequence[TrajectoryEvent], by_run) -> VersionRow:
    report = v.report or {}
    verdict = "base" if v.version == BASE_VERSION else report.get("verdict", "-")
    row = VersionRow(
        v.version,
        v.parent,
        v.status.value,
        verdict,
        report.get("reason", ""),
        list(report.get("failed", [])),
    )
    solved = [s for s, _ in evals.values()]
    row.eval_solved, row.eval_n = sum(solved), len(solved)
    if solved:
        row.eval_low, row.eval_high = wilson(row.eval_solved, row.eval_n)
    lengths = [n for _, n in evals.values() if n is not None]
    row.eval_answer_tokens = sum(lengths) / len(lengths) if lengths else None
    served = [t for t in runs if t.policy_version == v.version]
    row.traffic_runs = len(served)
    rewards = []
    for t in served:
        thumbs = [f.value for f in by_run[t.event_id] if f.kind.value == "thumbs"]
        row.thumbs_up += sum(1 for x in thumbs if x > 0)
        row.thumbs_down += sum(1 for x in thumbs if x < 0)
        score = mean_score(scored(by_run[t.event_id]))
        if score is not None:
            rewards.append(score)
    row.user_reward = sum(rewards) / len(rewards) if rewards else None
    row.train_reward, row.train_kl = v.metrics.get("reward"), v.metrics.get("kl")
    row.kl = 0.0 if v.version == BASE_VERSION else _guard(report, "kl_to_reference")
    row.trained_events = int(report.get("training", {}).get("trained_runs", 0) or 0)
    return row


def _guard(report: dict[str, Any], name: str) -> float | None:
    for g in report.get("guards", []):
        if g.get("name") == name:
            return g.get("figure")
    return None


def comparison(baseline: str, final: str, test: dict[str, Any], episodes: dict[str, Any]) -> dict:
    """The headline's figures: the sequential test's result (as `decide` stores it) and the
    whole runs' paired comparison, final vs baseline."""
    return {
        "baseline": baseline,
        "final": final,
        "tasks": test["looks"][-1]["tasks"],
        "samples": test["samples"],
        "champion_rate": test["champion_rate"],
        "candidate_rate": test["candidate_rate"],
        "diff": test["diff"],
        "ci_low": test["ci_low"],
        "ci_high": test["ci_high"],
        "improved": test["improved"],
        "not_worse": test["not_worse"],
        "correlation": test["correlation"],
        "excludes_zero": test["ci_low"] > 0 or test["ci_high"] < 0,
        "episodes": episodes,
    }


def headline(report: Report) -> str:
    """The one sentence the demo ends with: did it improve, with the interval."""
    imp = report.improvement
    if imp is None or imp["final"] == imp["baseline"]:
        return (
            f"No version passed the gate: the champion is still {report.champion}, so the "
            "demo did NOT show an improvement."
        )
    which = {"unseen": " no gate ran", "gates": " (the gates' own)"}.get(imp.get("draw"), "")
    figures = (
        f"{imp['final']} vs {imp['baseline']} on {imp['tasks']} held-out tasks{which} x "
        f"{imp['samples']} sampled runs (the same seeds for both): "
        f"{imp['champion_rate']:.0%} -> {imp['candidate_rate']:.0%}, difference "
        f"{imp['diff']:+.3f} (95% repeated CI {imp['ci_low']:+.3f} to {imp['ci_high']:+.3f})"
    )
    whole = imp.get("episodes", {}).get("comparison")
    if whole:
        figures += (
            f"; whole runs through the agent on {whole['n']} of them: "
            f"{whole['champion_rate']:.0%} -> {whole['candidate_rate']:.0%}"
        )
    if imp["excludes_zero"] and imp["diff"] > 0:
        return f"Improved: {figures}. The interval excludes zero."
    return f"Did NOT show an improvement whose interval excludes zero: {figures}."


def markdown(report: Report) -> str:
    """The report as Markdown: headline, the table per version, verdict reasons, timings."""
    head = list(COLUMNS)
    lines = [
        "# arloop demo report",
        "",
        headline(report),
        *(["", note] if (note := quick_note(report)) else []),
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    for r in report.versions:
        lines.append("| " + " | ".join(table_cells(r, report.champion)) + " |")
    lines += ["", "## Gate verdicts", ""]
    lines += [f"- **{r.version}** {r.verdict}: {r.reason}" for r in report.versions if r.reason]
    lines += ["", "## Feedback received", ""]
    lines += [f"- {k}: {v}" for k, v in sorted(report.feedback_counts.items())]
    if report.seconds:
        lines += ["", "## Time", ""]
        lines += [f"- {k}: {v:.0f} s" for k, v in report.seconds.items()]
    return "\n".join(lines) + "\n"


COLUMNS = (
    "version",
    "parent",
    "gate",
    "held-out success (95% CI)",
    "thumbs-up",
    "user reward",
    "train reward",
    "KL to base",
    "answer tokens",
)
"""The columns of the per-version table, as `table_cells` fills them (terminal and Markdown)."""


def table_cells(r: VersionRow, champion: str) -> list[str]:
    """One version's cells, as the terminal table and the Markdown show them."""
    success = "-"
    if r.eval_n:
        success = (
            f"{r.eval_solved}/{r.eval_n} = {r.eval_rate:.0%} [{r.eval_low:.0%}, {r.eval_high:.0%}]"
        )
    thumbs = (
        f"{r.thumbs_up_rate:.0%} of {r.thumbs_up + r.thumbs_down}"
        if r.thumbs_up_rate is not None
        else "-"
    )
    name = f"{r.version} (champion)" if r.version == champion else r.version
    return [
        name,
        r.parent or "-",
        r.verdict,
        success,
        thumbs,
        _num(r.user_reward),
        _num(r.train_reward),
        _num(r.kl, 4),
        _num(r.eval_answer_tokens, 1),
    ]


NARROW_COLUMNS = (
    "version",
    "from",
    "gate",
    "held-out\n[95% CI]",
    "thumbs\nup",
    "user\nreward",
    "train\nreward",
    "KL to\nbase",
    "answer\ntokens",
)
"""`COLUMNS` for a terminal under 133 columns: the same figures, shorter (80 columns hold them)."""


def narrow_cells(r: VersionRow, champion: str) -> list[str]:
    """`table_cells` in short: `v1*` the champion, `5/12 [19-68%]`, `38%/8`."""
    success = "-"
    if r.eval_n:
        low, high = round(100 * (r.eval_low or 0)), round(100 * (r.eval_high or 0))
        success = f"{r.eval_solved}/{r.eval_n} [{low}-{high}%]"
    n = r.thumbs_up + r.thumbs_down
    thumbs = f"{r.thumbs_up_rate:.0%}/{n}" if r.thumbs_up_rate is not None else "-"
    name = f"{r.version}*" if r.version == champion else r.version
    wide = table_cells(r, champion)
    return [name, r.parent or "-", r.verdict, success, thumbs, *wide[5:]]


def quick_note(report: Report) -> str | None:
    """What a run on the tiny test model shows, and what it does not (None: another model)."""
    if report.options.get("model") != "tiny":
        return None
    return (
        "This was the tiny test model (random weights, built on the fly): it is not expected "
        "to improve, and --quick only shows that every process and step of the loop works. "
        "The full demo (`arloop demo`: SmolLM2-135M, 2 rounds, about 7 minutes on 2 cores) "
        "shows the improvement: held-out success up with a 95% interval that excludes zero "
        "(docs/demo.md)."
    )


def _num(x: float | None, digits: int = 2) -> str:
    return "-" if x is None else f"{x:.{digits}f}"
