"""The reward-model ensemble: its fit, its pessimism, its held-out figure, its features."""

from __future__ import annotations

import math
import random

import torch

from learner.config import RoundConfig
from learner.policy.tiny_model import build_tiny_model
from learner.reward_model import (
    HELDOUT_SHARE,
    auroc,
    features,
    fit_ensemble,
    fit_from_runs,
    heldout,
)
from tests.learner.learner_events import completion_ids, feedback, prompt_ids, trajectory


def _blobs(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Good runs around +1, bad ones around -1 on the first of 6 features, noise elsewhere."""
    gen = torch.Generator().manual_seed(seed)
    y = (torch.arange(n) % 2).double()  # (N,)
    x = torch.randn(n, 6, generator=gen, dtype=torch.float64)  # (N, 6)
    x[:, 0] += 2 * y - 1
    return x, y


def test_auroc_hand_values():
    assert auroc([0.9, 0.8, 0.1], [True, True, False]) == 1.0
    assert auroc([0.1, 0.9], [True, False]) == 0.0
    assert auroc([0.5, 0.5], [True, False]) == 0.5  # a tie counts half
    assert math.isnan(auroc([0.3, 0.4], [True, True]))


def test_the_ensemble_ranks_runs_it_never_saw():
    x, y = _blobs(200, seed=0)
    model = fit_ensemble(x[:150], y[:150], heads=5, seed=0)
    mean, spread = model.scores(x[150:])
    assert auroc(mean.tolist(), (y[150:] > 0).tolist()) > 0.8
    assert mean.abs().max() <= 1 and (spread >= 0).all()


def test_pessimism_costs_most_where_the_heads_disagree():
    x, y = _blobs(60, seed=1)
    model = fit_ensemble(x, y, heads=8, seed=0)
    near = x[:5]
    far = x[:5].clone()
    far[:, 1:] *= 25  # far outside anything judged on the features that carry no signal
    _, spread_near = model.scores(near)
    _, spread_far = model.scores(far)
    assert spread_far.mean() > spread_near.mean()
    mean, _ = model.scores(far)
    assert (model.pessimistic(far, k=1.0) <= mean).all()
    assert torch.equal(model.pessimistic(far, k=0.0), mean.clamp(-1, 1))


def test_the_fit_is_deterministic_for_a_seed():
    x, y = _blobs(80, seed=2)
    a = fit_ensemble(x, y, heads=3, seed=7)
    b = fit_ensemble(x, y, heads=3, seed=7)
    c = fit_ensemble(x, y, heads=3, seed=8)
    assert torch.equal(a.weight, b.weight)  # bootstrap draws and L-BFGS are deterministic
    assert not torch.equal(a.weight, c.weight)  # and the seed picks the draws


def test_features_pool_the_completion_only_and_do_not_depend_on_the_batch():
    model, tok = build_tiny_model(seed=0)
    prompts = [prompt_ids("What is 12 plus 30?"), prompt_ids("hi")]
    completions = [completion_ids("The answer is 42."), completion_ids("sorry no")]
    together = features(model, prompts, completions, tok.pad_token_id, batch_size=2)
    apart = features(model, prompts, completions, tok.pad_token_id, batch_size=1)
    assert together.shape == (2, 2 * model.config.hidden_size)
    assert torch.allclose(together, apart, atol=1e-5)  # padding changes nothing


def test_features_run_the_lm_head_on_one_position_and_match_the_full_pass(monkeypatch):
    model, tok = build_tiny_model(seed=0)
    prompts = [prompt_ids("What is 12 plus 30?"), prompt_ids("hi")]
    completions = [completion_ids("The answer is 42."), completion_ids("sorry no")]
    shapes = []
    hook = model.get_output_embeddings().register_forward_hook(
        lambda module, args, out: shapes.append(tuple(out.shape))
    )
    try:
        got = features(model, prompts, completions, tok.pad_token_id, batch_size=2)
    finally:
        hook.remove()
    assert shapes and all(s[1] == 1 for s in shapes)  # (B, 1, V): no logits per token
    monkeypatch.setattr("learner.reward_model.last_logits_only", lambda model: {})
    full = features(model, prompts, completions, tok.pad_token_id, batch_size=2)
    assert torch.allclose(got, full, atol=1e-6)


def _judged_runs(n: int, good_share: float = 0.5):
    """Runs with fixed ids, so the held-out split (a hash of the id) is the same every time."""
    runs = []
    for i in range(n):
        good = i < n * good_share
        t = trajectory(f"What is {i} plus 30?", f"The answer is {i + 30}." if good else "sorry no")
        t = t.model_copy(update={"event_id": f"traj_judged_{i}"})
        runs.append((t, [feedback(t.event_id, "thumbs", 1 if good else -1)]))
    return runs


def test_fit_from_runs_reports_held_out_auroc_and_refuses_too_little():
    model, tok = build_tiny_model(seed=0)

    def featurize(p, c):
        return features(model, p, c, tok.pad_token_id)

    runs = _judged_runs(40)
    held = [good.value > 0 for t, [good] in runs if heldout(t.event_id)]
    assert 0 < sum(held) < len(held)  # both kinds held out, or AUROC is undefined
    report = fit_from_runs(runs, featurize, heads=4, seed=0, min_runs=16)
    assert report is not None and report.heads == 4
    assert report.train_runs + report.heldout_runs == 40 and report.heldout_runs > 0
    assert report.auroc > 0.9  # "The answer is ..." against "sorry no": easy to rank
    assert fit_from_runs(runs, featurize, heads=4, seed=0, min_runs=41) is None
    one_kind = _judged_runs(40, good_share=1.0)
    assert fit_from_runs(one_kind, featurize, heads=4, seed=0, min_runs=16) is None
    again = fit_from_runs(runs[::-1], featurize, heads=4, seed=0, min_runs=16)
    assert torch.equal(again.model.weight, report.model.weight)  # order of the store: no matter


def test_the_held_out_share_is_fixed_per_run():
    ids = [f"traj_{i}" for i in range(4000)]
    held = [heldout(i) for i in ids]
    assert held == [heldout(i) for i in ids]
    assert abs(sum(held) / len(ids) - HELDOUT_SHARE) < 0.03


def test_the_minimum_of_judged_runs_keeps_a_reward_model_without_signal_from_passing_its_check():
    """Why `reward_model_min_runs` is 64 and not one demo round's 48 judged runs: a model whose
    scores say nothing passes the held-out AUROC check (`reward_model_min_auroc`) by chance
    about 7 % of the time at 64 runs, about 11 % at 48 (simulated: the real held-out split,
    half the runs judged good, scores at random)."""
    config = RoundConfig()
    rng = random.Random(0)

    def false_pass(runs: int, trials: int = 5000) -> float:
        passed = 0
        for _ in range(trials):
            held = [heldout(f"run-{rng.getrandbits(64):x}") for _ in range(runs)]
            good = [rng.random() < 0.5 for h in held if h]
            score = auroc([rng.random() for _ in good], good)
            passed += not math.isnan(score) and score >= config.reward_model_min_auroc
        return passed / trials

    at_minimum, at_48 = false_pass(config.reward_model_min_runs), false_pass(48)
    print(
        f"\nno signal passes: {at_minimum:.3f} at {config.reward_model_min_runs}, {at_48:.3f} at 48"
    )
    assert at_minimum <= 0.08 < 0.09 <= at_48
