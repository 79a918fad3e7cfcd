"""The eval gate's legwork: draw held-out tasks, run both versions on them look by look, gather
the evidence, and let the pure decision (`learner.gate.eval_gate.decide`) judge.

1. Draw: the packs' held-out pools, in a stratified order seeded by the champion
   (`learner.gate.draws`): every candidate judged against one champion runs the same tasks
   (with `fresh_draw` off, every gate runs v0's tasks).
2. The sequential test (`learner.gate.sequential`): at each look both versions run the new
   tasks k times at the serving temperature with the same seeds, in the pack's first-turn
   form where it has one (else whole runs), until "not worse" and "improved" are settled
   (or "not worse" alone, with `stop_when_released`).
3. Whole runs at the serving temperature on the first `full_tasks` tasks (seed 0 of each):
   what users get, and how often the first-turn form agreed with it.
4. Greedy whole runs on the first `guard_tasks` tasks for the guards (answer length, tool
   use), and the candidate's KL and entropy on their logged tokens, with the training and
   off-policy figures from the learner's store (`learner.gate.figures`).
The champion's outcomes come from its cache (`learner.gate.eval_runs`) after its first gate.
The runs themselves are handed in (`Suite.runs`): the learner knows tasks as plain data, the
process that has the agents runs them (`deploy/learn/agent_runs.py` builds a runner).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from learner.gate.draws import draw_seed, sample_seed, stratified_order
from learner.gate.eval_gate import GateConfig, GateReport, SuiteRun, decide, on_guards, refuse
from learner.gate.eval_runs import SUITE, EvalError, EvalRuns, GateTask
from learner.gate.guards import GuardConfig
from learner.gate.sequential import SequentialResult, finished, sequential_test
from learner.gate.stats import paired_comparison, paired_intervals
from learner.policy.registry import BASE_VERSION, CHAMPION, PolicyRegistry
from learner.store import Store

Looked = Callable[[SequentialResult], None]
"""Called after each look of the sequential test (progress displays)."""


class SuiteMissing(RuntimeError):
    """A pack has no usable held-out suite; the message says which and why."""


@dataclass
class Suite:
    """The held-out pools that gate versions, and how their tasks are run."""

    name: str
    """The packs' names joined by `+`; empty: no eval pack, nothing can be judged."""
    pool: Callable[[], list[GateTask]]
    """Every held-out task of every pack; SuiteMissing before any call is made."""
    runs: EvalRuns
    temperature: float
    """The serving temperature the sampled forms run at (0: greedy, one sample per task)."""
    unjudged: tuple[str, ...] = ()
    """Packs the learner trains on that have no held-out suite (a team's agent learned from
    feedback alone): named in every report, never run."""


@dataclass
class Evaluation:
    """What one gate ran: the draw, the test, the whole-run figures, the guard runs."""

    items: list[GateTask]
    test: SequentialResult
    episodes: dict[str, Any] = field(default_factory=dict)
    candidate: SuiteRun | None = None
    champion: SuiteRun | None = None
    trajectories: list = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)


class GateRunner:
    """Evaluates one version against the champion and decides; it moves no alias."""

    def __init__(
        self,
        registry: PolicyRegistry,
        suite: Suite,
        config: GateConfig,
        *,
        model_cache: Path | None = None,
        guards: GuardConfig | None = None,
        store: Store | None = None,
        max_user_share: float = 0.2,
        looked: Looked | None = None,
        canary: bool = False,
    ) -> None:
        self.registry, self.suite, self.config = registry, suite, config
        self.guards = guards or GuardConfig()
        self.store, self.max_user_share, self.model_cache = store, max_user_share, model_cache
        self.looked = looked
        self.canary = canary
        """Whether a passing version goes out as a canary (`CanaryConfig.enabled`): what
        judges a team's agent that has no held-out tasks (`on_guards`)."""

    def evaluate(self, version: str, champion: str | None = None) -> GateReport:
        """The report for `version` vs the champion (verdict `error` when it cannot judge).
        Needs `model_cache` (the models' figures); `run` alone does not."""
        version = self.registry.resolve(version)
        champion = self.registry.resolve(champion or CHAMPION)
        report = self._judge(version, champion)
        return dataclasses.replace(report, unjudged=list(self.suite.unjudged))

    def _judge_on_guards(self, version: str, champion: str) -> GateReport:
        """No gate pack has held-out tasks (a team's agents, learned from feedback alone): the
        guards that read the version's training and logged traffic, the off-policy estimate
        on runs it was not trained on, then the canary, which compares its users' feedback
        with the champion's and rolls it back when worse. Without the canary, or without the
        learner's store (the training and the traffic), nothing would judge it: refused."""
        packs = ", ".join(self.suite.unjudged)
        if not self.canary or self.store is None:
            missing, fix = (
                ("the canary is off", "turn it on (ARLOOP_CANARY__ENABLED=true)")
                if not self.canary
                else ("there is no learner store", "judge it in `arloop learn`, which keeps one")
            )
            return refuse(
                version,
                champion,
                SUITE,
                f"no eval pack has held-out tasks ({packs} learn from feedback alone) and "
                f"{missing}: nothing would judge the release; {fix}, or give a pack tasks and "
                "a verifier",
            )
        from learner.gate.figures import gather  # torch and the models: only past the checks

        start = time.perf_counter()
        trained = [t for t, _ in self.store.trained_runs(version)]
        evidence, ope, training = gather(
            self.registry,
            self.store,
            version,
            trained,  # the KL and entropy guards read the completions it was trained on
            max_user_share=self.max_user_share,
            ope_runs=self.config.ope_max_runs,
            min_ess=self.config.min_ess,
            model_cache=self.model_cache or Path("."),
        )
        report = on_guards(
            version, champion, evidence, guard_config=self.guards, ope=ope, training=training
        )
        return dataclasses.replace(report, seconds={"figures": time.perf_counter() - start})

    def _judge(self, version: str, champion: str) -> GateReport:
        name = self.suite.name
        if not self.suite.name and self.suite.unjudged:
            return self._judge_on_guards(version, champion)
        if not self.suite.name:
            return refuse(
                version, champion, SUITE, "no eval pack (ARLOOP_EVAL_GATE / ARLOOP_EVAL_PACKS)"
            )
        try:
            run = self.run(version, champion)
        except SuiteMissing as exc:
            return refuse(version, champion, SUITE, str(exc), suite=name)
        except EvalError as exc:
            return refuse(version, champion, exc.failed, f"fail closed: {exc}", suite=name)
        from learner.gate.figures import gather  # torch and the models: only past the suite

        start = time.perf_counter()
        evidence, ope, training = gather(
            self.registry,
            self.store,
            version,
            run.trajectories,
            max_user_share=self.max_user_share,
            ope_runs=self.config.ope_max_runs,
            min_ess=self.config.min_ess,
            model_cache=self.model_cache or Path("."),
        )
        run.seconds["figures"] = time.perf_counter() - start
        report = decide(
            name,
            run.test,
            run.candidate,
            run.champion,
            evidence,
            self.config,
            guard_config=self.guards,
            ope=ope,
            training=training,
            episodes=run.episodes,
        )
        return dataclasses.replace(report, seconds=run.seconds)

    def run(
        self, version: str, champion: str, *, guards: bool = True, unseen_by: Sequence[str] = ()
    ) -> Evaluation:
        """Steps 1-4 of the module's list, without the models' figures (`guards` False: not
        step 4's greedy runs either, for a comparison that releases nothing). `unseen_by`:
        champions whose gates' tasks this run must not reuse; it draws from the rest of the
        pool (a check free of the selection those gates made), else the champion's draw."""
        c = self.config
        pool = self.suite.pool()
        order, draw = self.order(pool, version, champion, unseen_by)
        if not order:
            raise ValueError(
                f"the held-out pool ({len(pool)} tasks) has none that the gates of "
                f"{', '.join(unseen_by)} did not run: enlarge it"
            )
        items = [pool[i] for i in order]
        if self.suite.temperature > 0:  # an agent that samples greedily runs once a task
            seeds = [
                [sample_seed(i.key, j, draw) if i.samples else None for j in range(c.samples)]
                for i in items
            ]
        else:  # greedy: one run a task, the same as the guards' (one cache entry)
            seeds = [[None] for _ in items]
        start = time.perf_counter()
        test = self._sequential(version, champion, items, seeds)
        evaluation = Evaluation(items, test, seconds={"sampled": time.perf_counter() - start})
        start = time.perf_counter()
        evaluation.episodes = self._episodes(version, champion, items, seeds)
        if not guards:
            return evaluation
        guard_items = items[: c.guard_tasks]
        greedy = [None] * len(guard_items)
        runs = self.suite.runs
        base, _ = runs.episodes(champion, guard_items, greedy, 0.0)
        mine, evaluation.trajectories = runs.episodes(version, guard_items, greedy, 0.0, keep=True)
        evaluation.champion = SuiteRun(champion, tuple(base))
        evaluation.candidate = SuiteRun(version, tuple(mine))
        evaluation.seconds["episodes"] = time.perf_counter() - start
        return evaluation

    def order(
        self, pool: Sequence[GateTask], version: str, champion: str, unseen_by: Sequence[str] = ()
    ) -> tuple[list[int], int]:
        """(indices into `pool` a run takes, in order; the draw that seeds their samples): the
        champion's draw, or with `unseen_by` a draw of what those champions' gates did not
        take (as far as this config's looks reach), possibly shorter or empty."""
        strata = [i.stratum for i in pool]
        limit = max(self.config.looks)
        if not unseen_by:
            draw = self.draw(champion)
            return stratified_order(strata, draw, limit=limit), draw
        seen = {i for v in unseen_by for i in stratified_order(strata, self.draw(v), limit)}
        draw = draw_seed("unseen:" + version, self.suite.name)
        return [i for i in stratified_order(strata, draw) if i not in seen][:limit], draw

    def draw(self, champion: str) -> int:
        """The seed of the tasks a gate against `champion` runs (v0's with `fresh_draw` off)."""
        return draw_seed(champion if self.config.fresh_draw else BASE_VERSION, self.suite.name)

    def _sequential(self, version, champion, items, seeds) -> SequentialResult:
        c = self.config
        looks = sorted({min(n, len(items)) for n in c.looks})
        table: dict[str, list[list[int]]] = {champion: [], version: []}
        for n in looks:
            new = slice(len(table[version]), n)
            for v in (champion, version):
                table[v] += self._outcomes(v, items[new], seeds[new])
            test = sequential_test(
                table[champion],
                table[version],
                looks,
                margin=c.margin,
                alpha_not_worse=c.alpha,
                alpha_improved=c.alpha_improved,
                futility=c.futility,
                stop_when_released=c.stop_when_released,
            )
            if self.looked:
                self.looked(test)
            if finished(test, c.stop_when_released):
                break
        return test

    def _outcomes(self, version, items, seeds) -> list[list[int]]:
        """(tasks, k) 0/1 outcomes: the first-turn form where the pack has one, else whole runs."""
        out: list[list[int] | None] = [None] * len(items)
        t = self.suite.temperature
        quick = [i for i, item in enumerate(items) if item.first_turn]
        if quick:
            got = self.suite.runs.first_turns(
                version, [items[i] for i in quick], [seeds[i] for i in quick], t
            )
            for i, row in zip(quick, got, strict=True):
                out[i] = row
        whole = [i for i, row in enumerate(out) if row is None]
        if whole:  # whole runs, one per seed, all in flight together
            jobs = [(items[i], seed) for i in whole for seed in seeds[i]]
            runs, _ = self.suite.runs.episodes(version, *map(list, zip(*jobs, strict=True)), t)
            at = 0
            for i in whole:
                out[i] = [int(o.solved) for o in runs[at : at + len(seeds[i])]]
                at += len(seeds[i])
        return out  # type: ignore[return-value]

    def _episodes(self, version, champion, items, seeds) -> dict[str, Any]:
        """Whole runs at the serving temperature (seed 0 of each task): the users' figure, and
        the first-turn form's agreement with it on the same (task, seed)."""
        n = min(self.config.full_tasks, len(items))
        if n == 0:
            return {}
        chosen, first = items[:n], [row[0] for row in seeds[:n]]
        t = self.suite.temperature
        whole = {v: self.suite.runs.episodes(v, chosen, first, t)[0] for v in (champion, version)}
        out: dict[str, Any] = {"tasks": n, "temperature": t}
        cmp = paired_comparison(
            [int(o.solved) for o in whole[champion]], [int(o.solved) for o in whole[version]]
        )
        out["comparison"] = dataclasses.asdict(cmp) | paired_intervals(cmp)
        quick = [i for i, item in enumerate(chosen) if item.first_turn]
        if quick:
            agree = 0
            for v in (champion, version):
                turns = self.suite.runs.first_turns(
                    v, [chosen[i] for i in quick], [[first[i]] for i in quick], t
                )
                agree += sum(int(turns[j][0] == whole[v][i].solved) for j, i in enumerate(quick))
            out["first_turn_agreement"] = agree / (2 * len(quick))
            out["first_turn_pairs"] = 2 * len(quick)
        return out
