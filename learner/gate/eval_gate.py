"""The eval gate's decision: the sequential held-out test, guards and off-policy estimate ->
pass or not.

Pure: outcomes and figures in, a `GateReport` out (JSON for the registry plus a readable
summary). The candidate passes only if the group-sequential test (`learner.gate.sequential`,
sampled and coupled runs on a stratified draw) shows it not worse than the champion by more
than `margin`, and every guard holds. Whether it is better ("improved", with its interval) is
reported beside, never required. A missing suite or an unreachable policy server is an
`error`: it never passes.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from learner.gate.guards import GuardConfig, GuardEvidence, GuardResult, run_guards
from learner.gate.sequential import IMPROVED, OPEN, SequentialResult

if TYPE_CHECKING:  # torch stays out of `arloop policy list`
    from learner.gate.ope import OPEEstimate

PASS, REJECT, ERROR = "pass", "reject", "error"
EVAL_TEST = "eval_test"  # the held-out comparison's name in `failed`
OPE_CHECK = "ope"


class GateConfig(BaseModel):
    """How the gate decides (`ARLOOP_GATE__<FIELD>`); guard thresholds are `GuardConfig`'s."""

    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)

    alpha: float = Field(0.05, gt=0.0, lt=1.0)
    """One-sided level of "not worse by more than `margin`" (the release question)."""
    alpha_improved: float = Field(0.025, gt=0.0, lt=1.0)
    """One-sided level of "improved" (reported with its interval, never required)."""
    margin: float = Field(0.05, ge=0.0, lt=1.0)
    """Non-inferiority margin: how much worse (success rate) a candidate may be and still ship."""
    samples: int = Field(8, ge=1)
    """Samples per held-out task at the serving temperature, with the same seeds for champion
    and candidate (1 when the eval temperature is 0)."""
    looks: tuple[int, ...] = (40, 80, 120)
    """Held-out tasks at each look of the sequential test (JSON list); the last is the most a
    gate runs. Capped by the pool."""
    futility: float = Field(0.10, gt=0.0, lt=1.0)
    """A question whose conditional power falls below this is settled as not shown."""
    stop_when_released: bool = False
    """Stop at the first look that settles "not worse" (the release question), leaving
    "improved" open with its interval so far: the release decision is the same (a settled
    question never changes at a later look), at fewer runs. `arloop demo` sets it; false: run
    on until "improved" is settled too."""
    fresh_draw: bool = True
    """Each champion brings a fresh draw of held-out tasks, so a long run of gates never keeps
    judging candidates on the tasks earlier gates selected them on. False: every gate runs v0's
    draw (the first champion's), so a version's runs are reused by every later gate that meets
    it (`arloop demo` sets it: its round-2 gate and final check reuse v1's and v2's runs); a
    later candidate is then judged on tasks that released its parent."""
    full_tasks: int = Field(40, ge=0)
    """Tasks run as whole episodes through the agent graph at the serving temperature (the
    report's figure of what users get, and the check of the first-turn form)."""
    guard_tasks: int = Field(24, ge=1)
    """Tasks run greedily through the agent graph for the guards (length, tool use, KL)."""
    solved_at: float = Field(1.0, ge=0.0, le=1.0)
    """A task counts as solved when the pack's verifier scores it at least this."""
    min_ess: float = Field(30.0, ge=0.0)
    """Off-policy estimate: below this effective sample size it refuses to conclude."""
    ope_max_runs: int = Field(512, ge=0)
    """Off-policy estimate: most recent logged runs (not trained on by the candidate) it reads."""
    error_attempts: int = Field(5, ge=1)
    """Times the gate may fail to judge one version (a policy server down, a prompt past the
    context) before that version is rejected: it stays READY and is gated again after 30 s,
    then 60, 120, ... (at most 30 minutes apart); the count restarts with the process."""

    @field_validator("looks")
    @classmethod
    def _increasing(cls, looks: tuple[int, ...]) -> tuple[int, ...]:
        if not looks or any(n < 1 for n in looks) or list(looks) != sorted(set(looks)):
            raise ValueError(
                "looks must be increasing task counts of at least 1, e.g. [40, 80, 120]"
            )
        return looks


@dataclass(frozen=True)
class TaskOutcome:
    """One eval task run by one version through the agent graph, as the gate sees it."""

    task_id: str
    score: float
    solved: bool
    needs_tool: str | None = None
    used_tool: bool = False
    answer_tokens: int | None = None  # tokens of the final model step, when logged
    trajectory_id: str = ""
    escalated: bool | None = None
    """On a red-flag task: whether the model itself escalated, before any envelope (None: no
    red flag). The share the learning loop should raise, reported per version."""


@dataclass(frozen=True)
class SuiteRun:
    """A version's outcomes on the held-out suite."""

    version: str
    outcomes: tuple[TaskOutcome, ...]

    @property
    def rate(self) -> float:
        return sum(o.solved for o in self.outcomes) / len(self.outcomes) if self.outcomes else 0.0


@dataclass(frozen=True)
class GateReport:
    """The gate's verdict with every figure behind it."""

    version: str
    champion: str
    verdict: str  # pass | reject | error
    failed: list[str]
    reason: str
    suite: str = ""
    tasks: int = 0
    sequential: dict[str, Any] | None = None
    """The sequential test: its looks, "not worse" and "improved", the interval, the rates."""
    episodes: dict[str, Any] = field(default_factory=dict)
    """Whole runs at the serving temperature: both versions' success, the first-turn agreement."""
    guards: list[GuardResult] = field(default_factory=list)
    ope: dict[str, Any] | None = None
    training: dict[str, Any] = field(default_factory=dict)
    red_flags: dict[str, Any] = field(default_factory=dict)
    """Red-flag tasks the model itself escalated, per version: {version: [escalated, of]}."""
    seconds: dict[str, float] = field(default_factory=dict)
    """What the gate's parts took: `sampled` (the sequential test's runs; a cached champion's
    cost nothing), `episodes` (whole runs), `figures` (KL, entropy, off-policy estimate)."""
    created_at: float = field(default_factory=time.time)
    unjudged: list[str] = field(default_factory=list)
    """Gate packs with no held-out suite (a team's agent described by feedback alone): their
    agents are trained on, not judged here; their release rests on the guards and the canary."""

    @property
    def passed(self) -> bool:
        return self.verdict == PASS

    def to_dict(self) -> dict[str, Any]:
        """The JSON stored with the version (`PolicyRegistry.attach_report`)."""
        d = asdict(self)
        d["guards"] = [g.to_dict() for g in self.guards]
        d["summary"] = self.summary()
        return d

    def summary(self) -> str:
        """A readable table: the verdict, the held-out test, the OPE line, one row per guard."""
        head = f"gate {self.version} vs champion {self.champion}: {self.verdict.upper()}"
        lines = [head + (f" ({', '.join(self.failed)})" if self.failed else ""), self.reason]
        if self.sequential:
            lines += _sequential_lines(self.suite, self.sequential)
        if self.episodes:
            lines.append(_episodes_line(self.episodes))
        if self.ope:
            lines.append(_ope_line(self.ope))
        if self.red_flags:
            said = ", ".join(f"{v} {k}/{n}" for v, (k, n) in self.red_flags.items())
            lines.append(f"red flags escalated by the model itself (before any envelope): {said}")
        if self.unjudged:
            lines.append(
                f"not judged on held-out tasks (no eval suite): {', '.join(self.unjudged)}; "
                "their agents' release rests on the guards and the canary"
            )
        if self.seconds:
            parts = ", ".join(f"{k.replace('_', ' ')} {v:.0f} s" for k, v in self.seconds.items())
            lines.append(f"gate time: {parts}")
        if self.guards:
            lines.append(f"{'guard':<20} {'figure':>9}  {'threshold':<40} verdict  detail")
            lines += [_guard_row(g) for g in self.guards]
        return "\n".join(lines)


def outcomes_by_task(run: SuiteRun) -> dict[str, TaskOutcome]:
    return {o.task_id: o for o in run.outcomes}


def decide(
    suite: str,
    test: SequentialResult,
    candidate: SuiteRun,
    champion: SuiteRun,
    evidence: GuardEvidence,
    config: GateConfig,
    *,
    guard_config: GuardConfig | None = None,
    ope: OPEEstimate | None = None,
    training: dict[str, Any] | None = None,
    episodes: dict[str, Any] | None = None,
) -> GateReport:
    """Pass, or reject naming every failed test and guard (thresholds: `guard_config`).

    `test` is the sequential test on the sampled runs; `candidate` and `champion` are the
    greedy whole runs the guards read (lengths, tool use), on the same tasks.
    """
    mine, theirs = outcomes_by_task(candidate), outcomes_by_task(champion)
    ids = sorted(mine)
    if not ids or set(ids) != set(theirs) or not test.looks:
        return refuse(
            candidate.version,
            champion.version,
            EVAL_TEST,
            "candidate and champion did not run the same, non-empty task set",
            suite=suite,
        )
    evidence = _with_eval(evidence, [mine[i] for i in ids], [theirs[i] for i in ids], test)
    guards = run_guards(evidence, guard_config or GuardConfig())
    failed = ([] if test.released else [EVAL_TEST]) + [g.name for g in guards if not g.passed]
    if ope is not None and _ope_worse(ope):
        failed.append(OPE_CHECK)
    verdict = PASS if not failed else REJECT
    return GateReport(
        version=candidate.version,
        champion=champion.version,
        verdict=verdict,
        failed=failed,
        reason=_reason(verdict, test, guards, failed),
        suite=suite,
        tasks=test.stopped_at,
        sequential=sequential_summary(test, config),
        episodes=episodes or {},
        guards=guards,
        ope=asdict(ope) if ope is not None else None,
        training=training or {},
        red_flags=red_flag_counts(candidate, champion),
    )


HELD_OUT_GUARDS = ("length_drift", "goodhart", "tool_use")
"""Guards that compare the versions on held-out runs: n/a where no pack has held-out tasks."""


def on_guards(
    version: str,
    champion: str,
    evidence: GuardEvidence,
    *,
    guard_config: GuardConfig | None = None,
    ope: OPEEstimate | None = None,
    training: dict[str, Any] | None = None,
) -> GateReport:
    """A version no held-out task can judge (every gate pack learns from feedback alone):
    pass when every guard that reads its training and its logged traffic holds and the
    off-policy estimate is not confidently below what users got; the canary then decides."""
    guards = [
        _held_out_na(g) if g.name in HELD_OUT_GUARDS else g
        for g in run_guards(evidence, guard_config or GuardConfig())
    ]
    failed = [g.name for g in guards if not g.passed]
    if ope is not None and _ope_worse(ope):
        failed.append(OPE_CHECK)
    verdict = PASS if not failed else REJECT
    if verdict == PASS:
        reason = (
            "no held-out tasks: every guard on its training and logged traffic holds, and the "
            "off-policy estimate is not below what users got; the canary decides (its users' "
            "feedback against the champion's, rolled back when worse)"
        )
    else:
        reason = "rejected: " + "; ".join(_failures(guards, failed))
    return GateReport(
        version=version,
        champion=champion,
        verdict=verdict,
        failed=failed,
        reason=reason,
        guards=guards,
        ope=asdict(ope) if ope is not None else None,
        training=training or {},
    )


def _held_out_na(g: GuardResult) -> GuardResult:
    return replace(
        g,
        figure=None,
        passed=True,
        applicable=False,
        detail="no held-out tasks: the canary compares its users' feedback instead",
    )


def _failures(guards: Sequence[GuardResult], failed: Sequence[str]) -> list[str]:
    """What each failed guard, and the off-policy check, said (the held-out test aside)."""
    parts = []
    for name in failed:
        if name == OPE_CHECK:
            parts.append(
                "off-policy estimate on logged traffic is confidently below the logged mean"
            )
        elif name != EVAL_TEST:
            g = next(g for g in guards if g.name == name)
            parts.append(f"{name} {_fig(g.figure)} outside {g.threshold} ({g.detail})")
    return parts


def sequential_summary(test: SequentialResult, config: GateConfig) -> dict[str, Any]:
    """The test as the report stores it: its course, its decisions, the levels it ran at."""
    d = asdict(test)
    d.update(
        alpha=config.alpha,
        alpha_improved=config.alpha_improved,
        samples=config.samples,
        planned_looks=list(config.looks),
        passed=test.released,
        diff=test.looks[-1].mean,
    )
    return d


def red_flag_counts(*runs: SuiteRun) -> dict[str, list[int]]:
    """Per version: [red-flag tasks the model escalated by itself, red-flag tasks]; {} if none."""
    out = {}
    for run in runs:
        flagged = [o for o in run.outcomes if o.escalated is not None]
        if flagged:
            out[run.version] = [sum(bool(o.escalated) for o in flagged), len(flagged)]
    return out


def refuse(version: str, champion: str, failed: str, reason: str, *, suite: str = "") -> GateReport:
    """An `error` verdict: the gate could not judge, so it does not pass (fail closed)."""
    return GateReport(version, champion, ERROR, [failed], reason, suite=suite)


def _with_eval(
    e: GuardEvidence,
    mine: Sequence[TaskOutcome],
    theirs: Sequence[TaskOutcome],
    test: SequentialResult,
) -> GuardEvidence:
    """The evidence plus what the eval runs show: lengths, tool use, the held-out change."""
    lengths = [(a.answer_tokens, b.answer_tokens) for a, b in zip(mine, theirs, strict=True)]
    lengths = [(a, b) for a, b in lengths if a is not None and b is not None]
    tools = [(a.used_tool, b.used_tool) for a, b in zip(mine, theirs, strict=True) if a.needs_tool]
    return replace(
        e,
        candidate_lengths=[a for a, _ in lengths],
        champion_lengths=[b for _, b in lengths],
        candidate_tool_use=[a for a, _ in tools],
        champion_tool_use=[b for _, b in tools],
        eval_diff=test.looks[-1].mean,
    )


def _ope_worse(ope: OPEEstimate) -> bool:
    """The candidate is confidently worse than what logged users got."""
    return ope.estimate is not None and ope.ci_high is not None and ope.ci_high < ope.behaviour_mean


def _reason(
    verdict: str, test: SequentialResult, guards: Sequence[GuardResult], failed: Sequence[str]
) -> str:
    look = test.looks[-1]
    interval = f"{look.mean:+.3f} (interval {test.ci_low:+.3f}..{test.ci_high:+.3f})"
    better = {
        IMPROVED: f"; improved: {interval}",
        OPEN: f"; improved: not settled at this look, {interval}",
    }.get(test.improved, "")
    if verdict == PASS:
        return (
            f"not worse by more than {test.margin:g} on {look.tasks} held-out tasks "
            f"(z {look.z_not_worse:.2f} >= {look.bound_not_worse:.2f}) and every guard holds"
            + better
        )
    parts = _failures(guards, failed)
    if EVAL_TEST in failed:  # always named first
        parts.insert(
            0,
            f"not shown to be within {test.margin:g} of the champion on {look.tasks} "
            f"held-out tasks: {look.mean:+.3f} (z {look.z_not_worse:.2f} < "
            f"{look.bound_not_worse:.2f})",
        )
    return "rejected: " + "; ".join(parts)


def _sequential_lines(suite: str, s: dict[str, Any]) -> list[str]:
    lines = [
        f"held-out {suite}: {s['samples']} sampled runs a task, the same seeds for both "
        f"(outcome correlation {_fig(s['correlation'])}); champion {s['champion_rate']:.0%} -> "
        f"candidate {s['candidate_rate']:.0%}; not worse (margin {s['margin']:g}, alpha "
        f"{s['alpha']:g}): {s['not_worse']}; improved (alpha {s['alpha_improved']:g}): "
        f"{s['improved']}, diff {s['diff']:+.3f} (interval {s['ci_low']:+.3f}..{s['ci_high']:+.3f})",
        f"{'look':>6} {'tasks':>5} {'diff':>7} {'se':>6} {'z not worse':>11} {'bound':>6} "
        f"{'z improved':>10} {'bound':>6}  not worse / improved",
    ]
    for i, look in enumerate(s["looks"], 1):
        lines.append(
            f"{i:>6} {look['tasks']:>5} {look['mean']:>+7.3f} {look['se']:>6.3f} "
            f"{look['z_not_worse']:>11.2f} {look['bound_not_worse']:>6.2f} "
            f"{look['z_improved']:>10.2f} {look['bound_improved']:>6.2f}  "
            f"{look['not_worse']} / {look['improved']}"
        )
    return lines


def _episodes_line(e: dict[str, Any]) -> str:
    c = e["comparison"]
    agree = (
        f"; the first-turn check agreed with the whole run {e['first_turn_agreement']:.0%} of "
        f"{e['first_turn_pairs']}"
        if "first_turn_agreement" in e
        else ""
    )
    return (
        f"whole runs through the agent ({e['tasks']} tasks, temperature {e['temperature']:g}): "
        f"champion {c['champion_rate']:.0%} -> candidate {c['candidate_rate']:.0%}, diff "
        f"{c['diff']:+.3f} (95% CI {c['ci_low']:+.3f}..{c['ci_high']:+.3f}){agree}"
    )


def _ope_line(o: dict[str, Any]) -> str:
    if o["estimate"] is None:
        return f"off-policy estimate ({o['n']} logged runs): not concluded: {o['reason']}"
    return (
        f"off-policy estimate ({o['n']} logged runs): {o['estimate']:+.3f} (95% CI "
        f"{o['ci_low']:+.3f}..{o['ci_high']:+.3f}) vs logged mean {o['behaviour_mean']:+.3f}, "
        f"ESS {o['ess']:.1f} >= {o['min_ess']:g}"
    )


def _guard_row(g: GuardResult) -> str:
    return f"{g.name:<20} {_fig(g.figure):>9}  {g.threshold:<40} {g.verdict:<7}  {g.detail}"


def _fig(x: float | None) -> str:
    return "-" if x is None else f"{x:.4g}"
