"""The gate's group-sequential test: published boundaries, and its error rates by simulation."""

from __future__ import annotations

import numpy as np
import pytest

from learner.gate.sequential import (
    IMPROVED,
    NOT_SHOWN,
    NOT_WORSE,
    OPEN,
    WORSE,
    boundaries,
    finished,
    obf_spending,
    sequential_test,
)

LOOKS = (40, 80, 120)  # `arloop learn`'s default (GateConfig)
DEMO_LOOKS = (24, 48)  # `arloop demo`'s (deploy/demo/options.py)
K = 8  # samples per task (`arloop learn`'s, and the demo's final check)
DEMO_K = 6  # the demo's gates
RUNS = 2000


def test_boundaries_match_the_published_lan_demets_obrien_fleming_values():
    # Jennison & Turnbull (2000), table 7.6 / gsDesign: 3 equal looks, one-sided 0.025
    assert boundaries(0.025, (1 / 3, 2 / 3, 1.0)) == pytest.approx((3.710, 2.511, 1.993), abs=5e-3)
    assert boundaries(0.025, (1.0,)) == pytest.approx((1.960,), abs=1e-3)  # one look: plain z
    assert obf_spending(0.05, 1.0) == pytest.approx(0.05)


def _streams(
    effect: float, seed: int, runs: int = RUNS, coupling: float = 0.5, n: int = 120, k: int = K
):
    """(runs, tasks, k) outcomes of both versions. Four task kinds in draw order (interleaved):
    the champion solves two weak kinds ~25 % and two strong ones ~80 % of the time, task by
    task around that (Beta); the candidate differs by 2 * effect on the weak kinds only (the
    demo's pattern: learning moves the operators the model gets wrong), so `effect` is the
    mean change over tasks. A sample shares its random draw with the other version's same-seed
    sample with probability `coupling` (seeds couple, different weights decouple)."""
    rng = np.random.default_rng(seed)
    weak = (np.arange(n) % 4) < 2  # (n,)
    p = np.where(weak, rng.beta(2.5, 7.5, (runs, n)), rng.beta(8, 2, (runs, n)))  # (R, n)
    q = np.clip(p + np.where(weak, 2 * effect, 0.0), 0.0, 1.0)  # (R, n)
    u = rng.random((runs, n, k))
    shared = rng.random((runs, n, k)) < coupling
    v = np.where(shared, u, rng.random((runs, n, k)))
    return (u < p[..., None]).astype(int), (v < q[..., None]).astype(int)


def _rates(
    effect: float, seed: int, looks: tuple[int, ...] = LOOKS, k: int = K
) -> dict[str, float]:
    champion, candidate = _streams(effect, seed, n=looks[-1], k=k)
    results = [sequential_test(a, b, looks) for a, b in zip(champion, candidate, strict=True)]
    return {
        "not worse": np.mean([r.not_worse == NOT_WORSE for r in results]),
        "improved": np.mean([r.improved == IMPROVED for r in results]),
        "tasks": np.mean([r.stopped_at for r in results]),
    }


@pytest.mark.parametrize(("looks", "k"), [(LOOKS, K), (DEMO_LOOKS, DEMO_K)], ids=["learn", "demo"])
def test_error_rates_and_power_over_synthetic_outcome_streams(looks, k):
    null, worse, better = (
        _rates(e, seed, looks, k) for e, seed in ((0.0, 1), (-0.10, 2), (0.10, 3))
    )
    print(f"\nlooks {looks}, k {k}\nno effect: {null}\ntrue -10: {worse}\ntrue +10: {better}")
    assert null["improved"] <= 0.05  # type I error of "improved"
    assert worse["not worse"] <= 0.01  # a 10-point regression is not released
    assert better["improved"] >= 0.8  # power at a true +10
    # an equal candidate usually releases (the demo's smaller gate: about 66 % of the time)
    assert null["not worse"] >= (0.8 if looks == LOOKS else 0.6)
    assert null["tasks"] < looks[-1]  # and the looks stop early on average


def test_a_clear_gain_stops_at_the_first_look_with_an_interval_above_zero():
    champion = [[0] * K] * 20 + [[1] * K] * 20
    candidate = [[1] * K] * 40
    r = sequential_test(champion, candidate, LOOKS)
    assert (r.not_worse, r.improved, r.stopped_at) == (NOT_WORSE, IMPROVED, 40)
    assert r.ci_low > 0 and r.candidate_rate == 1.0 and r.champion_rate == 0.5


def test_a_clear_loss_is_refused():
    champion = [[1] * K] * 40
    candidate = [[1] * K] * 20 + [[0] * K] * 20
    r = sequential_test(champion, candidate, LOOKS)
    assert (r.not_worse, r.improved) == (WORSE, NOT_SHOWN) and not r.released
    assert r.ci_high < 0


def test_identical_outcomes_are_not_worse_and_not_improved():
    same = [[1, 0] * (K // 2)] * 120
    r = sequential_test(same, same, LOOKS)
    assert (r.not_worse, r.improved) == (NOT_WORSE, NOT_SHOWN)
    assert r.correlation == pytest.approx(1.0)


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="same"):
        sequential_test([[1, 0]], [[1]], LOOKS)
    with pytest.raises(ValueError, match="look"):
        sequential_test([[1]], [[1]], [0])


def test_looks_beyond_the_rows_given_are_left_open_for_a_later_call():
    champion, candidate = _streams(0.0, seed=5, runs=1)
    r = sequential_test(champion[0][:40], candidate[0][:40], LOOKS)
    full = sequential_test(champion[0], candidate[0], LOOKS)
    assert len(r.looks) == 1 and r.looks[0] == full.looks[0]  # the same first look
    assert not r.settled and OPEN in (r.not_worse, r.improved)  # an even draw: look again
    assert len(full.looks) > 1 and full.settled


def test_stopping_at_release_keeps_every_release_decision_and_runs_fewer_tasks():
    # `arloop demo`'s gates stop once "not worse" is settled (GateConfig.stop_when_released)
    for effect, seed in ((0.0, 1), (-0.10, 2), (0.10, 3)):
        champion, candidate = _streams(effect, seed, runs=500, n=DEMO_LOOKS[-1], k=DEMO_K)
        pairs = list(zip(champion, candidate, strict=True))
        full = [sequential_test(a, b, DEMO_LOOKS) for a, b in pairs]
        quick = [sequential_test(a, b, DEMO_LOOKS, stop_when_released=True) for a, b in pairs]
        assert [r.not_worse for r in quick] == [r.not_worse for r in full]
        assert all(finished(r, stop_when_released=True) for r in quick)
        # "improved" is only ever claimed where the full run claims it too (same boundaries)
        claimed = [f.improved for q, f in zip(quick, full, strict=True) if q.improved == IMPROVED]
        assert all(x == IMPROVED for x in claimed)
        tasks = (np.mean([r.stopped_at for r in quick]), np.mean([r.stopped_at for r in full]))
        shown = np.mean([r.improved == IMPROVED for r in quick])
        print(
            f"\neffect {effect:+.2f}: mean tasks {tasks[0]:.1f} vs {tasks[1]:.1f}; improved {shown}"
        )
        assert tasks[0] <= tasks[1]
        if effect >= 0:  # a candidate that is not worse settles at the first look, mostly
            assert tasks[0] < tasks[1]


def test_the_demos_final_check_settles_a_20_point_gain_at_its_first_look_mostly():
    champion, candidate = _streams(0.20, seed=4, runs=1000, n=DEMO_LOOKS[-1], k=DEMO_K)
    results = [sequential_test(a, b, DEMO_LOOKS) for a, b in zip(champion, candidate, strict=True)]
    first = np.mean([r.improved == IMPROVED and r.stopped_at == DEMO_LOOKS[0] for r in results])
    print(f"\n+20 points: improved at the first look {first:.3f}")
    assert first >= 0.7  # deploy/demo/options.py's FINAL_CHECK comment gives the figure (76 %)
    assert all(r.improved == IMPROVED for r in results)  # and by its last look, always
