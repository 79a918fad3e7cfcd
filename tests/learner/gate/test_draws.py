"""Stratified, seeded draws and coupled sampling seeds."""

from collections import Counter

from learner.gate.draws import draw_seed, sample_seed, stratified_order


def test_every_prefix_of_the_order_is_stratified():
    strata = ["add"] * 120 + ["sub"] * 120 + ["mul"] * 120 + ["div"] * 120 + ["gsm8k"] * 40
    order = stratified_order(strata, seed=7)
    assert sorted(order) == list(range(len(strata)))  # a permutation of the pool
    for n in (40, 80, 120):
        counts = Counter(strata[i] for i in order[:n])
        for kind, size in Counter(strata).items():
            assert abs(counts[kind] - n * size / len(strata)) <= 1, (n, counts)


def test_the_draw_depends_on_the_seed_and_only_on_it():
    strata = ["a"] * 50 + ["b"] * 50
    assert stratified_order(strata, 1, limit=20) == stratified_order(strata, 1, limit=20)
    assert stratified_order(strata, 1, limit=20) != stratified_order(strata, 2, limit=20)
    assert len(stratified_order(strata, 1, limit=500)) == 100  # never more than the pool


def test_seeds_are_shared_by_both_versions_and_differ_by_task_sample_and_draw():
    d1, d2 = draw_seed("v1"), draw_seed("v2")
    assert d1 != d2 and d1 == draw_seed("v1")
    seeds = {sample_seed(t, j, d1) for t in ("t1", "t2") for j in range(8)}
    assert len(seeds) == 16 and all(0 <= s < 2**31 for s in seeds)
    assert sample_seed("t1", 0, d1) != sample_seed("t1", 0, d2)
