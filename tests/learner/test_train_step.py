"""PolicyTrainer on the tiny model: the update moves the right weights in the right direction."""

from __future__ import annotations

import dataclasses
import logging
import math
import warnings

import pytest
import torch
from peft import PeftModel

from learner.logprobs import completion_logprobs, make_batch, selected_logprobs, token_logprobs
from learner.policy.models import apply_lora
from learner.policy.tiny_model import build_tiny_model
from learner.samples import Judged, PreferencePair, Sample
from learner.step_inputs import token_chunks
from learner.train_step import OPTIMIZER_FILE, PolicyTrainer, TrainConfig

# peft asks transformers a deprecated question on every forward
warnings.filterwarnings("ignore", category=FutureWarning)


@pytest.fixture
def tiny():
    model, tokenizer = build_tiny_model(seed=0)
    return model, tokenizer


def _ids(tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text)


def _logp(trainer: PolicyTrainer, prompt: list[int], completion: list[int], pad: int) -> float:
    return completion_logprobs(trainer.model, prompt, completion, pad).sum().item()


def _snapshot(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.named_parameters()}


def test_update_raises_rewarded_and_lowers_punished_completion(tiny):
    model, tok = tiny
    pad = tok.pad_token_id
    trainer = PolicyTrainer(model, pad, TrainConfig(learning_rate=5e-3, kl_coef=0.0))
    prompt, good, bad = (
        _ids(tok, "What is 12 plus 30?"),
        _ids(tok, "The answer is 42."),
        _ids(tok, "sorry wrong"),
    )
    good_before, bad_before = _logp(trainer, prompt, good, pad), _logp(trainer, prompt, bad, pad)
    for _ in range(2):
        trainer.step([Sample(prompt, good, advantage=1.0), Sample(prompt, bad, advantage=-1.0)])
    assert _logp(trainer, prompt, good, pad) > good_before
    assert _logp(trainer, prompt, bad, pad) < bad_before


def test_lora_changes_only_adapter_weights(tiny):
    model, tok = tiny
    trainer = PolicyTrainer(model, tok.pad_token_id, TrainConfig(learning_rate=1e-2))
    before = _snapshot(trainer.model)
    trainer.step([Sample(_ids(tok, "hi"), _ids(tok, "hello there"), advantage=1.0)])
    after = _snapshot(trainer.model)
    adapter = [k for k in before if "lora_" in k]
    assert adapter and all(not before[k].requires_grad for k in before)  # snapshot sanity
    assert any(not torch.equal(before[k], after[k]) for k in adapter if "lora_B" in k)
    assert all(torch.equal(before[k], after[k]) for k in before if "lora_" not in k)


def test_full_finetune_changes_base_weights_and_keeps_a_frozen_reference(tiny):
    model, tok = tiny
    trainer = PolicyTrainer(
        model, tok.pad_token_id, TrainConfig(learning_rate=1e-2, full_finetune=True, kl_coef=0.1)
    )
    before = _snapshot(trainer.model)
    sample = Sample(_ids(tok, "hi"), _ids(tok, "hello there"), advantage=1.0)
    first = trainer.step([sample])
    after = _snapshot(trainer.model)
    changed = [k for k in before if not torch.equal(before[k], after[k])]
    assert any("layers.0.self_attn.q_proj" in k for k in changed)
    assert first["kl"] == 0.0  # policy == reference before the first update
    assert trainer.step([sample])["kl"] > 0.0  # the reference did not move with the policy


def test_tokens_outside_the_loss_mask_have_no_influence(tiny):
    _, tok = tiny
    prompt, completion = (
        _ids(tok, "Use the calculator tool."),
        _ids(tok, "12+30 = 42. The answer is 42."),
    )
    n = len(completion)
    mask = [1] * 3 + [0] * (n - 6) + [1] * 3  # the middle is tool output
    behaviour = [-2.0] * n
    other = [-2.0] * 3 + [-50.0] * (n - 6) + [-2.0] * 3  # different only where the mask is 0
    results = []
    for logged in (behaviour, other):
        model, _ = build_tiny_model(seed=0)
        trainer = PolicyTrainer(
            model, tok.pad_token_id, TrainConfig(learning_rate=1e-2, kl_coef=0.1)
        )
        metrics = trainer.step(
            [Sample(prompt, completion, 1.0, behaviour_logprobs=logged, loss_mask=mask)]
        )
        results.append((metrics, _snapshot(trainer.model)))
    (m1, p1), (m2, p2) = results
    assert m1["num_tokens"] == 6 and m1["loss"] == m2["loss"]
    assert all(torch.equal(p1[k], p2[k]) for k in p1)


def test_missing_behaviour_logprobs_mean_ratio_one(tiny):
    model, tok = tiny
    trainer = PolicyTrainer(model, tok.pad_token_id, TrainConfig(learning_rate=1e-3))
    m = trainer.step([Sample(_ids(tok, "hi"), _ids(tok, "hello there"), advantage=1.0)])
    assert m["ratio_mean"] == pytest.approx(1.0) and m["clip_ratio"] == 0.0
    assert math.isnan(m["probs_corr"])  # nothing logged to correlate with


def test_first_use_clips_against_the_proximal_not_the_stale_behaviour(tiny):
    model, tok = tiny
    pad = tok.pad_token_id
    trainer = PolicyTrainer(model, pad, TrainConfig(learning_rate=1e-3, kl_coef=0.0, is_cap=2.0))
    prompt, completion = _ids(tok, "hi"), _ids(tok, "hello there")
    current = completion_logprobs(trainer.model, prompt, completion, pad)
    # ratio e ~ 2.7 to the behaviour: clipping against it would stop every token's gradient
    stale = (current - 1.0).tolist()
    m = trainer.step([Sample(prompt, completion, 1.0, behaviour_logprobs=stale)])
    assert m["ratio_mean"] == 1.0 and m["clip_ratio"] == 0.0 and m["grad_norm"] > 0.0
    assert m["behaviour_ratio_mean"] == pytest.approx(math.e, rel=1e-4)
    assert m["is_weight_mean"] == pytest.approx(2.0) and m["is_truncated"] == 1.0  # e cut to 2
    assert m["probs_corr"] == pytest.approx(1.0, abs=1e-5)  # scaled, still perfectly correlated


def test_a_second_step_on_the_same_samples_clips_against_their_first_use(tiny):
    model, tok = tiny
    pad = tok.pad_token_id
    trainer = PolicyTrainer(model, pad, TrainConfig(learning_rate=5e-2, kl_coef=0.0))
    prompt, completion = _ids(tok, "hi"), _ids(tok, "hello there")
    stale = (completion_logprobs(trainer.model, prompt, completion, pad) - 1.0).tolist()
    sample = Sample(prompt, completion, 1.0, behaviour_logprobs=stale)
    assert trainer.step([sample])["ratio_mean"] == 1.0
    first_use = list(sample.proximal_logprobs)
    assert len(first_use) == len(completion) and all(math.isfinite(x) for x in first_use)
    second = trainer.step([sample])
    assert second["ratio_mean"] != pytest.approx(1.0, abs=1e-3)  # the policy moved from it
    assert second["clip_ratio"] > 0  # and the clip holds it near the first use
    assert sample.proximal_logprobs == first_use  # kept, not overwritten by the second use
    fresh = dataclasses.replace(sample, proximal_logprobs=None)
    assert trainer.step([fresh])["ratio_mean"] == 1.0  # a sample never trained on: its own anchor


def test_proximal_logprobs_align_with_loss_masks_and_micro_batches(tiny):
    model, tok = tiny
    pad = tok.pad_token_id
    trainer = PolicyTrainer(model, pad, TrainConfig(learning_rate=1e-2, micro_batch_size=2))
    prompt = _ids(tok, "hi")
    texts = ["hello", "12+30 = 42. The answer is 42.", "sorry wrong"]
    samples = [
        Sample(prompt, _ids(tok, t), advantage=a) for t, a in zip(texts, [1, -1, 0.5], strict=True)
    ]
    n = len(samples[1].completion_ids)
    samples[1].loss_mask = [1] * 3 + [0] * (n - 6) + [1] * 3
    before = [completion_logprobs(trainer.model, prompt, s.completion_ids, pad) for s in samples]
    trainer.step(samples)  # longest first: the masked sample and "sorry wrong", then "hello"
    for s, expected in zip(samples, before, strict=True):
        mask = s.loss_mask or [1] * len(s.completion_ids)
        got = torch.tensor(s.proximal_logprobs)
        keep = torch.tensor(mask, dtype=torch.bool)
        assert torch.allclose(got[keep], expected[keep], atol=1e-5)
        assert got[~keep].isnan().all()  # never computed, never read


def test_metrics_in_trl_vocabulary(tiny):
    model, tok = tiny
    pad = tok.pad_token_id
    trainer = PolicyTrainer(model, pad, TrainConfig(learning_rate=1e-3))
    p, a, b = _ids(tok, "hi"), _ids(tok, "hello"), _ids(tok, "good bad correct")
    logged = completion_logprobs(trainer.model, p, b, pad).tolist()
    samples = [
        Sample(p, a, 0.0, reward=1.0, group="g1", policy_version=1),
        Sample(p, b, 0.0, reward=1.0, group="g1", policy_version=2, behaviour_logprobs=logged),
        Sample(p, a, 1.0, reward=2.0, group="g2", policy_version=2),
        Sample(p, b, -1.0, reward=0.0, group="g2"),
    ]
    m = trainer.step(samples, current_version=3)
    assert m["frac_reward_zero_std"] == 0.5  # g1 all equal, g2 not
    assert m["policy_version_lag"] == pytest.approx((2 + 1 + 1) / 3)
    assert m["reward"] == 1.0 and m["reward_std"] == pytest.approx(
        torch.tensor([1.0, 1, 2, 0]).std().item()
    )
    assert m["completions/mean_length"] == (2 * len(a) + 2 * len(b)) / 4
    assert m["probs_corr"] == pytest.approx(1.0, abs=1e-5)  # logged by this very policy
    assert m["kl"] == 0.0 and m["entropy"] > 0 and m["lr"] == 1e-3 and m["grad_norm"] > 0
    assert m["num_tokens"] == 2 * len(a) + 2 * len(b)


def test_micro_batching_gives_the_same_update(tiny):
    _, tok = tiny
    texts = ["hello there", "The answer is 42.", "sorry", "Triage: see a doctor."]
    samples = [
        Sample(_ids(tok, "hi"), _ids(tok, t), advantage=a)
        for t, a in zip(texts, [1, -1, 0.5, 2], strict=True)
    ]
    start, updates, losses = None, [], []
    for size in (1, 4):
        model, _ = build_tiny_model(seed=0)
        trainer = PolicyTrainer(
            model, tok.pad_token_id, TrainConfig(learning_rate=1e-3, micro_batch_size=size)
        )
        start = _snapshot(trainer.model)
        losses.append(trainer.step(samples)["loss"])
        after = _snapshot(trainer.model)
        updates.append(torch.cat([(after[k] - start[k]).flatten() for k in start]))
    assert losses[0] == pytest.approx(losses[1], abs=1e-6)
    # Adam's first step is ~lr * sign(grad): allow the rare sign flip of a near-zero gradient
    assert (updates[0] - updates[1]).norm() < 1e-3 * updates[1].norm()


def test_selected_logprobs_match_full_logits(tiny):
    model, tok = tiny
    batch = make_batch(
        [_ids(tok, "hi"), _ids(tok, "What is 12?")], [_ids(tok, "hello"), _ids(tok, "42")], 0
    )
    with torch.no_grad():
        full, full_entropy = token_logprobs(model, batch, with_entropy=True)
        flat, flat_entropy = selected_logprobs(model, batch, with_entropy=True)
    keep = batch.completion_mask > 0
    assert torch.allclose(full[keep], flat, atol=1e-5)
    assert torch.allclose(full_entropy[keep], flat_entropy, atol=1e-4)


def test_save_then_reload_adapter_gives_same_logprobs(tiny, tmp_path):
    model, tok = tiny
    pad = tok.pad_token_id
    trainer = PolicyTrainer(model, pad, TrainConfig(learning_rate=1e-2))
    prompt, completion = _ids(tok, "hi"), _ids(tok, "hello there")
    trainer.step([Sample(prompt, completion, advantage=1.0)])
    trainer.save(tmp_path / "v1")
    assert (tmp_path / "v1" / "adapter_config.json").exists()
    assert (tmp_path / "v1" / "adapter_model.safetensors").exists()
    reloaded = PeftModel.from_pretrained(build_tiny_model(seed=0)[0], str(tmp_path / "v1")).eval()
    expected = completion_logprobs(trainer.model, prompt, completion, pad)
    assert torch.allclose(
        completion_logprobs(reloaded, prompt, completion, pad), expected, atol=1e-6
    )
    resumed = PolicyTrainer(
        build_tiny_model(seed=0)[0],
        pad,
        TrainConfig(learning_rate=1e-2),
        adapter_dir=tmp_path / "v1",
    )
    assert torch.allclose(
        completion_logprobs(resumed.model, prompt, completion, pad), expected, atol=1e-6
    )
    assert resumed.step([Sample(prompt, completion, advantage=1.0)])["kl"] > 0  # reference = base


def test_full_finetune_saves_safetensors(tiny, tmp_path):
    model, tok = tiny
    trainer = PolicyTrainer(model, tok.pad_token_id, TrainConfig(full_finetune=True))
    trainer.save(tmp_path / "full")
    assert (tmp_path / "full" / "model.safetensors").exists()


def _adam_state(trainer: PolicyTrainer) -> dict[int, dict[str, torch.Tensor]]:
    return trainer._optimizer.state_dict()["state"]


def _assert_same_adam_state(a: PolicyTrainer, b: PolicyTrainer) -> None:
    sa, sb = _adam_state(a), _adam_state(b)
    assert sa and sa.keys() == sb.keys()
    for key in sa:
        assert sa[key]["step"].item() == sb[key]["step"].item() == 1
        assert torch.equal(sa[key]["exp_avg"], sb[key]["exp_avg"])
        assert torch.equal(sa[key]["exp_avg_sq"], sb[key]["exp_avg_sq"])


def test_continuing_an_adapter_continues_adams_moments(tiny, tmp_path):
    model, tok = tiny
    pad = tok.pad_token_id
    trainer = PolicyTrainer(model, pad, TrainConfig(learning_rate=1e-2))
    sample = Sample(_ids(tok, "hi"), _ids(tok, "hello there"), advantage=1.0)
    trainer.step([sample])
    trainer.save(tmp_path / "v1")
    assert (tmp_path / "v1" / OPTIMIZER_FILE).exists()
    resumed = PolicyTrainer(
        build_tiny_model(seed=0)[0],
        pad,
        TrainConfig(learning_rate=5e-3),
        adapter_dir=tmp_path / "v1",
    )
    _assert_same_adam_state(trainer, resumed)
    assert resumed.step([sample])["lr"] == 5e-3  # this round's learning rate, not the saved one
    assert all(s["step"].item() == 2 for s in _adam_state(resumed).values())
    apply_lora(build_tiny_model(seed=0)[0], tmp_path / "v1")  # the policy server ignores the file


def test_full_finetune_continues_adam_from_optimizer_state(tiny, tmp_path):
    model, tok = tiny
    pad = tok.pad_token_id
    config = TrainConfig(learning_rate=1e-2, full_finetune=True)
    trainer = PolicyTrainer(model, pad, config)
    trainer.step([Sample(_ids(tok, "hi"), _ids(tok, "hello there"), advantage=1.0)])
    trainer.save(tmp_path / "full")
    resumed = PolicyTrainer(
        build_tiny_model(seed=0)[0], pad, config, optimizer_state=tmp_path / "full" / OPTIMIZER_FILE
    )
    _assert_same_adam_state(trainer, resumed)


def test_optimizer_state_of_another_lora_rank_is_ignored_with_a_warning(tiny, tmp_path, caplog):
    model, tok = tiny
    pad = tok.pad_token_id
    sample = Sample(_ids(tok, "hi"), _ids(tok, "hello there"), advantage=1.0)
    rank4 = PolicyTrainer(model, pad, TrainConfig(lora_rank=4))
    rank4.step([sample])
    rank4.save(tmp_path / "r4")
    with caplog.at_level(logging.WARNING, logger="learner.train_step"):
        rank16 = PolicyTrainer(
            build_tiny_model(seed=0)[0],
            pad,
            TrainConfig(lora_rank=16),
            optimizer_state=tmp_path / "r4" / OPTIMIZER_FILE,
        )
    assert "starting a fresh AdamW" in caplog.text
    assert _adam_state(rank16) == {}
    assert rank16.step([sample])["grad_norm"] > 0  # and it trains


def test_micro_batches_are_cut_by_rows_and_by_padded_tokens():
    items = [9, 5, 5, 4, 3, 2, 1]  # lengths, longest first as a step orders them
    assert token_chunks(items, 8, 10**6, int) == [items]
    assert token_chunks(items, 3, 10**6, int) == [[9, 5, 5], [4, 3, 2], [1]]
    # padded to the chunk's longest: 9 + 5 would be 2 x 9 = 18 > 16
    assert token_chunks(items, 8, 16, int) == [[9], [5, 5, 4], [3, 2, 1]]
    assert token_chunks([20, 3], 8, 16, int) == [[20], [3]]  # too long for any pass: alone


@pytest.mark.parametrize("kind", ["pg", "dpo"])
def test_a_token_cap_splits_a_step_into_more_passes_and_gives_the_same_update(tiny, kind):
    """Long rows (an agent's answer after a long tool output) train in more, smaller passes:
    activation memory follows tokens. The update is the same, to float rounding."""
    _, tok = tiny
    prompt = _ids(tok, "What is 12 plus 30? " * 6)
    texts = ["hello there", "The answer is 42.", "sorry", "Triage: see a doctor."]
    samples = [
        Sample(prompt, _ids(tok, t), advantage=a)
        for t, a in zip(texts, [1, -1, 0.5, 2], strict=True)
    ]
    pairs = [
        PreferencePair(prompt, _ids(tok, a), _ids(tok, b))
        for a, b in zip(texts[:-1], texts[1:], strict=True)
    ]
    longest = len(prompt) + max(len(_ids(tok, t)) for t in texts)
    updates, passes = [], []
    for cap in (10**6, longest * 2):  # everything in one pass; two rows a pass (one pair)
        model, _ = build_tiny_model(seed=0)
        config = TrainConfig(learning_rate=1e-3, micro_batch_size=8, micro_batch_tokens=cap)
        trainer = PolicyTrainer(model, tok.pad_token_id, config)
        name = "_pg_micro_step" if kind == "pg" else "_dpo_micro_step"
        seen, real = [], getattr(trainer, name)
        counted = lambda chunk, *a, seen=seen, real=real: seen.append(len(chunk)) or real(chunk, *a)  # noqa: E731
        setattr(trainer, name, counted)
        start = _snapshot(trainer.model)
        trainer.step(samples) if kind == "pg" else trainer.dpo_step(pairs)
        after = _snapshot(trainer.model)
        updates.append(torch.cat([(after[k] - start[k]).flatten() for k in start]))
        passes.append(seen)
    if kind == "pg":
        assert passes == [[4], [2, 2]]
    else:
        assert passes == [[3], [1, 1, 1]]
    assert (updates[0] - updates[1]).norm() < 1e-3 * updates[1].norm()


def test_dpo_step_widens_the_chosen_minus_rejected_margin(tiny):
    model, tok = tiny
    pad = tok.pad_token_id
    trainer = PolicyTrainer(model, pad, TrainConfig(learning_rate=5e-3))
    prompt, chosen, rejected = (
        _ids(tok, "What is 12 plus 30?"),
        _ids(tok, "42"),
        _ids(tok, "sorry wrong"),
    )

    def margin() -> float:
        return _logp(trainer, prompt, chosen, pad) - _logp(trainer, prompt, rejected, pad)

    before = margin()
    first = trainer.dpo_step([PreferencePair(prompt, chosen, rejected)] * 2)
    assert first["loss"] == pytest.approx(math.log(2), abs=1e-5)  # policy == reference at the start
    trainer.dpo_step([PreferencePair(prompt, chosen, rejected)] * 2)
    assert margin() > before


def test_bad_input_is_refused_with_a_reason(tiny):
    model, tok = tiny
    trainer = PolicyTrainer(model, tok.pad_token_id, TrainConfig())
    p, c = _ids(tok, "hi"), _ids(tok, "hello")
    with pytest.raises(ValueError, match="at least one sample"):
        trainer.step([])
    with pytest.raises(ValueError, match="behaviour logprobs"):
        trainer.step([Sample(p, c, 1.0, behaviour_logprobs=[0.0] * (len(c) + 1))])
    with pytest.raises(ValueError, match="finite"):
        trainer.step([Sample(p, c, 1.0, behaviour_logprobs=[-math.inf] * len(c))])
    with pytest.raises(ValueError, match="loss_mask"):
        trainer.step([Sample(p, c, 1.0, loss_mask=[2] * len(c))])
    with pytest.raises(ValueError, match="proximal logprobs"):
        trainer.step([Sample(p, c, 1.0, proximal_logprobs=[0.0] * (len(c) - 1))])
    with pytest.raises(ValueError, match="nothing to train on"):
        trainer.step([Sample(p, c, 1.0, loss_mask=[0] * len(c))])
    with pytest.raises(ValueError, match="at least one token"):
        trainer.dpo_step([PreferencePair(p, [], c)])
    with pytest.raises(ValueError, match="full fine-tuning"):
        PolicyTrainer(
            build_tiny_model()[0],
            tok.pad_token_id,
            TrainConfig(full_finetune=True),
            adapter_dir=".",
        )


def test_a_kto_step_raises_desirable_answers_and_lowers_undesirable_ones(tiny):
    model, tok = tiny
    pad = tok.pad_token_id
    trainer = PolicyTrainer(model, pad, TrainConfig(learning_rate=1e-2, kl_coef=0.0))
    rows = [("What is 12 plus 30?", "The answer is 42.", True), ("hi", "sorry no", False)]
    rows += [("What is 5 plus 3?", "8", True), ("hello", "good bad correct", False)]
    judged = [Judged(_ids(tok, p), _ids(tok, c), good) for p, c, good in rows]
    before = [_logp(trainer, j.prompt_ids, j.completion_ids, pad) for j in judged]
    m = trainer.kto_step(judged)
    after = [_logp(trainer, j.prompt_ids, j.completion_ids, pad) for j in judged]
    for j, b, a in zip(judged, before, after, strict=True):
        assert (a > b) if j.desirable else (a < b)
    assert (m["count/desirable"], m["count/undesirable"]) == (2, 2)
    assert m["kl"] == 0.0  # the first step: the policy is its reference, z0 = 0
    assert m["rewards/chosen"] == 0.0 and m["grad_norm"] > 0
    assert trainer.kto_step(judged)["kl"] >= 0.0


def test_a_kto_step_refuses_what_it_cannot_use(tiny):
    model, tok = tiny
    trainer = PolicyTrainer(model, tok.pad_token_id, TrainConfig())
    one = Judged(_ids(tok, "hi"), _ids(tok, "hello"), True)
    with pytest.raises(ValueError, match="at least two"):
        trainer.kto_step([one])
    with pytest.raises(ValueError, match="weight"):
        trainer.kto_step([one, dataclasses.replace(one, weight=math.nan)])


def test_a_restated_pairs_nll_raises_the_changed_tokens_beyond_what_dpo_alone_does(tiny):
    """The cross-entropy on the tokens a restated pair changed (the label) pulls them up in
    the model's own context; with weight 0 the step is DPO alone and reports no NLL."""
    _, tok = tiny
    pad = tok.pad_token_id
    prompt = _ids(tok, "my chest feels tight")
    head = _ids(tok, "Rest at home. Triage:")
    chosen, rejected = head + _ids(tok, " urgent"), head + _ids(tok, " self-care")

    def tail_logp(weight: float) -> tuple[float, dict[str, float]]:
        model, _ = build_tiny_model(seed=0)
        trainer = PolicyTrainer(model, pad, TrainConfig(learning_rate=5e-3))
        pair = PreferencePair(prompt, chosen, rejected, nll_weight=weight, nll_from=len(head))
        for _ in range(3):
            metrics = trainer.dpo_step([pair] * 2)
        lp = completion_logprobs(trainer.model, prompt, chosen, pad)
        return lp[len(head) :].sum().item(), metrics

    dpo_only, plain = tail_logp(0.0)
    with_nll, mixed = tail_logp(1.0)
    assert plain["nll"] == 0.0 and mixed["nll"] > 0.0
    assert with_nll > dpo_only + 0.1, (with_nll, dpo_only)


@pytest.mark.parametrize("kind", ["pg", "dpo", "kto"])
@pytest.mark.parametrize("fails", [False, True])
def test_every_update_ends_in_eval_mode_with_the_heap_trimmed(tiny, monkeypatch, kind, fails):
    import learner.train_step as train_step

    model, tok = tiny
    trainer = PolicyTrainer(model, tok.pad_token_id, TrainConfig())
    trims: list[bool] = []
    monkeypatch.setattr(train_step, "trim_heap", lambda: trims.append(trainer.model.training))
    if fails:

        def boom(*args, **kwargs):
            assert trainer.model.training  # the failure came mid-update, in train mode
            raise RuntimeError("out of memory")

        monkeypatch.setattr(trainer, "_optimiser_step", boom)
    p, good, bad = _ids(tok, "What is 2 plus 2?"), _ids(tok, "4"), _ids(tok, "five")
    update = {
        "pg": lambda: trainer.step([Sample(p, good, 1.0), Sample(p, bad, -1.0)]),
        "dpo": lambda: trainer.dpo_step([PreferencePair(p, good, bad)]),
        "kto": lambda: trainer.kto_step([Judged(p, good, True), Judged(p, bad, False)]),
    }[kind]
    if fails:
        with pytest.raises(RuntimeError, match="out of memory"):
            update()
    else:
        update()
    assert trims == [False]  # trimmed once, after eval mode was restored
    assert not trainer.model.training
