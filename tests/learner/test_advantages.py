"""Advantage estimators against values worked out by hand."""

from __future__ import annotations

import pytest
import torch

from learner.losses import (
    RunningBaseline,
    group_advantages,
    rloo_advantages,
    running_baseline_advantages,
)


def test_rloo_hand_values_sum_to_zero():
    # r = [1, 0, 0, 1]: a 1 is compared with the mean of the other three, 1/3 -> +2/3;
    # a 0 with 2/3 -> -2/3
    adv = rloo_advantages(torch.tensor([1.0, 0.0, 0.0, 1.0]))
    assert adv.tolist() == pytest.approx([2 / 3, -2 / 3, -2 / 3, 2 / 3])
    random = rloo_advantages(torch.randn(37, generator=torch.Generator().manual_seed(0)))
    assert random.sum().item() == pytest.approx(0.0, abs=1e-5)


def test_rloo_single_sample_has_no_baseline_to_beat():
    assert rloo_advantages(torch.tensor([3.0])).tolist() == [0.0]


def test_group_advantages_hand_values():
    # group 0: r = [1, 0, 1, 1], mean 0.75, unbiased std sqrt((3 * 0.25^2 + 0.75^2) / 3) = 0.5
    # group 7: r = [2, 2]: zero std -> zero advantage
    rewards = torch.tensor([1.0, 0.0, 1.0, 1.0, 2.0, 2.0])
    groups = torch.tensor([0, 0, 0, 0, 7, 7])
    adv = group_advantages(rewards, groups, eps=1e-4)
    expected = [0.25 / 0.5001, -0.75 / 0.5001, 0.25 / 0.5001, 0.25 / 0.5001, 0.0, 0.0]
    assert adv.tolist() == pytest.approx(expected, abs=1e-6)
    centred = group_advantages(rewards, groups, scale_std=False)
    assert centred.tolist() == pytest.approx([0.25, -0.75, 0.25, 0.25, 0.0, 0.0])


def test_group_advantages_zero_std_and_singleton_groups_are_zero():
    adv = group_advantages(torch.tensor([5.0, 5.0, 5.0, 1.0]), torch.tensor([3, 3, 3, 9]))
    assert adv.tolist() == [0.0, 0.0, 0.0, 0.0]


def test_group_advantages_interleaved_groups():
    rewards = torch.tensor([1.0, 10.0, 3.0, 30.0])
    adv = group_advantages(rewards, torch.tensor([1, 2, 1, 2]), scale_std=False)
    assert adv.tolist() == pytest.approx([-1.0, -10.0, 1.0, 10.0])


def test_running_baseline_first_batch_then_moving_average():
    state = RunningBaseline(momentum=0.9)
    adv, s1 = running_baseline_advantages(torch.tensor([1.0, 3.0]), state)
    assert adv.tolist() == [-1.0, 1.0]  # no history: the batch mean 2 is the baseline
    assert (s1.mean, s1.count) == (2.0, 2)
    adv, s2 = running_baseline_advantages(torch.tensor([4.0, 6.0]), s1)
    assert adv.tolist() == [2.0, 4.0]  # the baseline before this batch, 2
    assert s2.mean == pytest.approx(0.9 * 2.0 + 0.1 * 5.0) and s2.count == 4
    assert (state.mean, state.count) == (0.0, 0)  # pure: the old state is untouched
