"""The eval gate's decision: held-out comparison, guards and off-policy estimate -> pass or not.

Pure: outcomes and figures in, a `GateReport` out (JSON for the registry plus a readable
summary). The candidate passes only if its held-out success is not worse than the champion's
beyond noise (exact one-sided McNemar test at `alpha`) and every guard holds. A missing suite
or an unreachable policy server is an `error`: it never passes.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field

from learner.gate.guards import GuardConfig, GuardEvidence, GuardResult, run_guards
from learner.gate.stats import PairedComparison, paired_comparison

if TYPE_CHECKING:  # torch stays out of `arloop policy list`
    from learner.gate.ope import OPEEstimate

PASS, REJECT, ERROR = "pass", "reject", "error"
EVAL_TEST = "eval_test"  # the held-out comparison's name in `failed`
OPE_CHECK = "ope"


class GateConfig(BaseModel):
    """How the gate decides (`ARLOOP_GATE__<FIELD>`); guard thresholds are `GuardConfig`'s."""

    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)

    alpha: float = Field(0.05, gt=0.0, lt=1.0)
    """Level of the one-sided McNemar test of "candidate worse than champion" on the suite."""
    solved_at: float = Field(1.0, ge=0.0, le=1.0)
    """A task counts as solved when the pack's verifier scores it at least this."""
    min_ess: float = Field(30.0, ge=0.0)
    """Off-policy estimate: below this effective sample size it refuses to conclude."""
    ope_max_runs: int = Field(512, ge=0)
    """Off-policy estimate: most recent logged runs (not trained on by the candidate) it reads."""


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
    comparison: dict[str, Any] | None = None
    guards: list[GuardResult] = field(default_factory=list)
    ope: dict[str, Any] | None = None
    training: dict[str, Any] = field(default_factory=dict)
    red_flags: dict[str, Any] = field(default_factory=dict)
    """Red-flag tasks the model itself escalated, per version: {version: [escalated, of]}."""
    seconds: dict[str, float] = field(default_factory=dict)
    """What the gate's parts took: `eval_runs` (both versions' suites; a cached champion's
    costs nothing), `figures` (KL, entropy and the off-policy estimate on the models)."""
    created_at: float = field(default_factory=time.time)

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
        if self.comparison:
            lines.append(_comparison_line(self.suite, self.comparison))
        if self.ope:
            lines.append(_ope_line(self.ope))
        if self.red_flags:
            said = ", ".join(f"{v} {k}/{n}" for v, (k, n) in self.red_flags.items())
            lines.append(f"red flags escalated by the model itself (before any envelope): {said}")
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
    candidate: SuiteRun,
    champion: SuiteRun,
    evidence: GuardEvidence,
    config: GateConfig,
    *,
    guard_config: GuardConfig | None = None,
    ope: OPEEstimate | None = None,
    training: dict[str, Any] | None = None,
) -> GateReport:
    """Pass, or reject naming every failed test and guard (thresholds: `guard_config`)."""
    mine, theirs = outcomes_by_task(candidate), outcomes_by_task(champion)
    ids = sorted(mine)
    if not ids or set(ids) != set(theirs):
        return refuse(
            candidate.version,
            champion.version,
            EVAL_TEST,
            "candidate and champion did not run the same, non-empty task set",
            suite=suite,
        )
    cmp = paired_comparison(
        [int(theirs[i].solved) for i in ids], [int(mine[i].solved) for i in ids]
    )
    test_ok = cmp.p_worse >= config.alpha
    evidence = _with_eval(evidence, [mine[i] for i in ids], [theirs[i] for i in ids], cmp)
    guards = run_guards(evidence, guard_config or GuardConfig())
    failed = ([] if test_ok else [EVAL_TEST]) + [g.name for g in guards if not g.passed]
    if ope is not None and _ope_worse(ope):
        failed.append(OPE_CHECK)
    verdict = PASS if not failed else REJECT
    reason = _reason(verdict, cmp, config.alpha, guards, failed)
    return GateReport(
        version=candidate.version,
        champion=champion.version,
        verdict=verdict,
        failed=failed,
        reason=reason,
        suite=suite,
        tasks=len(ids),
        comparison=asdict(cmp) | {"alpha": config.alpha, "passed": test_ok},
        guards=guards,
        ope=asdict(ope) if ope is not None else None,
        training=training or {},
        red_flags=red_flag_counts(candidate, champion),
    )


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
    cmp: PairedComparison,
) -> GuardEvidence:
    """The evidence plus what the suite runs show: lengths, tool use, the held-out change."""
    lengths = [(a.answer_tokens, b.answer_tokens) for a, b in zip(mine, theirs, strict=True)]
    lengths = [(a, b) for a, b in lengths if a is not None and b is not None]
    tools = [(a.used_tool, b.used_tool) for a, b in zip(mine, theirs, strict=True) if a.needs_tool]
    return replace(
        e,
        candidate_lengths=[a for a, _ in lengths],
        champion_lengths=[b for _, b in lengths],
        candidate_tool_use=[a for a, _ in tools],
        champion_tool_use=[b for _, b in tools],
        eval_diff=cmp.diff,
    )


def _ope_worse(ope: OPEEstimate) -> bool:
    """The candidate is confidently worse than what logged users got."""
    return ope.estimate is not None and ope.ci_high is not None and ope.ci_high < ope.behaviour_mean


def _reason(
    verdict: str,
    cmp: PairedComparison,
    alpha: float,
    guards: Sequence[GuardResult],
    failed: Sequence[str],
) -> str:
    if verdict == PASS:
        return (
            f"not worse on held-out tasks (p={cmp.p_worse:.3g} >= {alpha:g}) and every guard holds"
        )
    parts = []
    for name in failed:
        if name == EVAL_TEST:
            parts.append(
                f"worse on held-out tasks: {cmp.diff:+.3f}, McNemar p={cmp.p_worse:.3g} < {alpha:g}"
            )
        elif name == OPE_CHECK:
            parts.append(
                "off-policy estimate on logged traffic is confidently below the logged mean"
            )
        else:
            g = next(g for g in guards if g.name == name)
            parts.append(f"{name} {_fig(g.figure)} outside {g.threshold} ({g.detail})")
    return "rejected: " + "; ".join(parts)


def _comparison_line(suite: str, c: dict[str, Any]) -> str:
    verdict = "pass" if c["passed"] else "FAIL"
    return (
        f"held-out {suite} ({c['n']} tasks): champion {c['champion_rate']:.0%} -> candidate "
        f"{c['candidate_rate']:.0%}, diff {c['diff']:+.3f} (95% CI {c['ci_low']:+.3f}.."
        f"{c['ci_high']:+.3f}); exact one-sided McNemar p(worse)={c['p_worse']:.3g}, "
        f"alpha {c['alpha']:g}: {verdict}"
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
