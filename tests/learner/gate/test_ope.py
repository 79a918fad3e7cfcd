import pytest
import torch

from learner.gate.evidence import LoggedRun, off_policy_estimate
from learner.gate.ope import snis


def test_same_policy_gives_the_plain_mean_and_full_ess():
    r = torch.tensor([1.0, 0.0, 1.0, 1.0] * 10)
    lp = torch.randn(40)
    est = snis(r, lp, lp, min_ess=10)
    assert est.estimate == pytest.approx(0.75)
    assert est.ess == pytest.approx(40)
    assert est.ci_low < 0.75 < est.ci_high


def test_weights_shift_the_estimate_by_hand():
    # two responses: reward 1 with weight e^1, reward 0 with weight e^0 -> e/(e+1)
    r = torch.tensor([1.0, 0.0])
    behaviour = torch.tensor([-2.0, -2.0])
    candidate = torch.tensor([-1.0, -2.0])
    est = snis(r, behaviour, candidate, min_ess=1)
    e = torch.e
    assert est.estimate == pytest.approx(float(e / (e + 1)))
    assert est.ess == pytest.approx(float((e + 1) ** 2 / (e**2 + 1)))


def test_refuses_when_one_weight_dominates():
    r = torch.rand(100)
    behaviour = torch.zeros(100)
    candidate = torch.zeros(100)
    candidate[0] = 50.0  # the candidate would produce only the first response
    est = snis(r, behaviour, candidate, min_ess=30)
    assert est.estimate is None and est.ess < 2
    assert "effective sample size" in est.reason


def test_huge_log_ratios_do_not_overflow():
    r = torch.tensor([1.0, 0.0, 1.0])
    est = snis(r, torch.tensor([-900.0] * 3), torch.tensor([-10.0, -10.0, -10.0]), min_ess=1)
    assert est.estimate == pytest.approx(2 / 3)


def test_empty_traffic():
    est = snis(torch.tensor([]), torch.tensor([]), torch.tensor([]))
    assert est.estimate is None and est.n == 0


def _runs(n: int) -> list[LoggedRun]:
    step = ((1, 2), (3,), (-0.5,))  # prompt ids, completion ids, behaviour logprobs
    return [LoggedRun(f"t{i}", "v0", float(i % 2), {}, 1, (step,), True) for i in range(n)]


def test_fewer_runs_than_the_minimum_ess_refuse_without_running_the_model():
    called: list[int] = []

    def candidate(seqs):
        called.append(len(seqs))
        return [torch.tensor([-0.5]) for _ in seqs]

    est = off_policy_estimate(_runs(29), candidate, min_ess=30)
    assert est.estimate is None and est.n == 29 and not called  # an ESS never exceeds n
    assert est.behaviour_mean == pytest.approx(14 / 29) and "only 29 logged runs" in est.reason
    est = off_policy_estimate(_runs(30), candidate, min_ess=30)
    assert called == [30] and est.estimate == pytest.approx(0.5)  # equal weights: the mean
