import math

import pytest

from learner.gate.stats import (
    paired_comparison,
    pearson,
    pearson_from_sums,
    sequential_compare,
    wilson,
)


def test_wilson_matches_a_worked_value():
    # 8/10 at z=1.96: centre (0.8 + 0.19208)/1.38415 = 0.71674, half = 1.96*sqrt(0.016+0.00960)/1.38415
    low, high = wilson(8, 10)
    assert low == pytest.approx(0.4902, abs=1e-3)
    assert high == pytest.approx(0.9433, abs=1e-3)


def test_paired_comparison_identical_outcomes():
    out = [1, 0, 1, 1, 0] * 8
    r = paired_comparison(out, out)
    assert r.diff == 0 and r.p_worse == 1.0
    assert r.ci_low < 0 < r.ci_high


def test_paired_comparison_clearly_worse_candidate():
    champion = [1] * 30 + [0] * 10
    candidate = [0] * 20 + [1] * 10 + [0] * 10  # lost 20 tasks the champion solved, won none
    r = paired_comparison(champion, candidate)
    assert r.diff == pytest.approx(-0.5)
    assert r.p_worse == pytest.approx(0.5**20)  # all 20 discordant pairs favour the champion
    assert r.ci_high < 0


def test_paired_comparison_better_candidate_interval_excludes_zero():
    champion = [0] * 30 + [1] * 10
    candidate = [1] * 25 + [0] * 5 + [1] * 10
    r = paired_comparison(champion, candidate)
    assert r.diff == pytest.approx(25 / 40)
    assert r.ci_low > 0 and r.p_worse > 0.99


def test_paired_comparison_needs_equal_lengths():
    with pytest.raises(ValueError):
        paired_comparison([1, 0], [1])


def test_sequential_rolls_back_a_clearly_worse_arm():
    d = sequential_compare([1.0] * 200, [0.0] * 200)
    assert d.verdict == "rollback" and d.ci_high < 0


def test_sequential_promotes_an_equal_arm_only_with_enough_data():
    few = sequential_compare([1.0, 0.0] * 5, [1.0, 0.0] * 5)
    assert few.verdict == "continue"
    many = sequential_compare([1.0, 0.0] * 3000, [1.0, 0.0] * 3000)
    assert many.verdict == "promote" and many.ci_low > -0.05


def test_sequential_interval_shrinks_like_sqrt_log_n():
    r1 = sequential_compare([0.5] * 100, [0.5] * 100)
    r2 = sequential_compare([0.5] * 10000, [0.5] * 10000)
    w1, w2 = r1.ci_high - r1.ci_low, r2.ci_high - r2.ci_low
    assert 5 < w1 / w2 < 10 * math.sqrt(math.log(10000) / math.log(100))


def test_pearson_by_hand():
    # x = 1,2,3 y = 2,4,7: mx 2, my 13/3; sxy = (-1)(-7/3) + 0 + (1)(8/3) = 5; sxx = 2;
    # syy = 49/9 + 1/9 + 64/9 = 114/9; r = 5 / sqrt(2 * 114/9)
    assert pearson([1, 2, 3], [2, 4, 7]) == pytest.approx(5 / math.sqrt(2 * 114 / 9))
    assert pearson([1, 1, 1], [1, 2, 3]) is None


def _sums(xs, ys) -> list[float]:
    return [len(xs), sum(xs), sum(ys), sum(x * x for x in xs), sum(y * y for y in ys)] + [
        sum(x * y for x, y in zip(xs, ys, strict=True))
    ]


def test_pearson_from_parts_matches_and_flat_sides_give_none():
    xs, ys = [0.2, 0.5, 0.9, 0.4], [0.1, 0.7, 0.8, 0.3]
    halves = _sums(xs[:2], ys[:2]), _sums(xs[2:], ys[2:])  # as micro-batches add them up
    total = [a + b for a, b in zip(*halves, strict=True)]
    assert pearson_from_sums(*total) == pytest.approx(pearson(xs, ys))
    assert pearson([0.1] * 3, [1, 2, 3]) is None  # 0.1 does not vary, whatever rounding says
    assert pearson([1, 2], [1]) is None and pearson([1], [2]) is None
    assert pearson_from_sums(0, 0, 0, 0, 0, 0) is None
