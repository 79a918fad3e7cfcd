"""The loss math against values worked out by hand."""

from __future__ import annotations

import math

import pytest
import torch

from learner.losses import (
    clipped_pg_loss,
    dpo_loss,
    entropy_from_logits,
    kl_k3,
    kto_loss,
    kto_reference_point,
    masked_mean,
)


def test_masked_mean_over_all_and_per_row():
    x = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    assert masked_mean(x, mask).item() == pytest.approx(7 / 3)  # (1 + 2 + 4) / 3
    assert masked_mean(x, mask, dim=1).tolist() == pytest.approx([1.5, 4.0])
    assert masked_mean(x, torch.zeros_like(mask)).item() == 0.0  # empty mask: 0, not NaN


def test_kl_k3_hand_value_zero_when_equal_and_never_negative():
    # d = log(0.25 / 0.5) = -ln 2: e^d - d - 1 = 0.5 + 0.693147 - 1 = 0.193147
    value = kl_k3(torch.tensor([math.log(0.5)]), torch.tensor([math.log(0.25)]))
    assert value.item() == pytest.approx(0.5 + math.log(2) - 1, abs=1e-6)
    logp = torch.randn(1000) * 3
    assert torch.equal(kl_k3(logp, logp), torch.zeros(1000))
    assert (kl_k3(logp, torch.randn(1000) * 3) >= 0).all()
    assert (kl_k3(logp, logp + 1e-7) >= 0).all()  # tiny differences do not round below zero


def test_entropy_from_logits_hand_values():
    uniform = entropy_from_logits(torch.zeros(4))
    assert uniform.item() == pytest.approx(math.log(4))
    # logits [0, ln 3] -> p = [1/4, 3/4]: H = -(0.25 ln 0.25 + 0.75 ln 0.75) = 0.562335
    h = entropy_from_logits(torch.tensor([[0.0, math.log(3)]]))
    assert h.item() == pytest.approx(-(0.25 * math.log(0.25) + 0.75 * math.log(0.75)), abs=1e-6)


def _five_tokens():
    # behaviour logp 0, so the ratio r = exp(logp): tokens a..e with advantages A
    #   a: r=1.0, A=+1 -> -min(1.0, 1.0)        = -1.0  grad -r*A/5 = -0.2
    #   b: r=1.5, A=+1 -> -min(1.5, 1.2)        = -1.2  clipped high, grad 0
    #   c: r=0.5, A=-1 -> -min(-0.5, -0.8)      = +0.8  clipped low,  grad 0
    #   d: r=0.5, A=+1 -> -min(0.5, 0.8)        = -0.5  pushes up unclipped, grad -0.1
    #   e: r=1.5, A=-1 -> -min(-1.5, -1.2)      = +1.5  pushes down unclipped, grad +0.3
    # mean = (-1 - 1.2 + 0.8 - 0.5 + 1.5) / 5 = -0.08; clip_ratio = 2/5
    logp = torch.log(torch.tensor([[1.0, 1.5, 0.5, 0.5, 1.5]])).requires_grad_(True)
    adv = torch.tensor([[1.0, 1.0, -1.0, 1.0, -1.0]])
    return logp, torch.zeros(1, 5), adv, torch.ones(1, 5)


def test_clipped_pg_loss_hand_values_and_gradient_on_both_sides():
    logp, behaviour, adv, mask = _five_tokens()
    out = clipped_pg_loss(logp, behaviour, adv, mask, clip_eps=0.2)
    assert out.loss.item() == pytest.approx(-0.08, abs=1e-6)
    assert out.clip_ratio.item() == pytest.approx(0.4)
    assert out.ratio_mean.item() == pytest.approx((1 + 1.5 + 0.5 + 0.5 + 1.5) / 5)
    # no proximal: it is the behaviour, the importance weight is 1
    assert out.behaviour_ratio_mean.item() == out.ratio_mean.item()
    assert out.is_weight_mean.item() == 1.0 and out.is_truncated.item() == 0.0
    out.loss.backward()
    assert logp.grad[0].tolist() == pytest.approx([-0.2, 0.0, 0.0, -0.1, 0.3], abs=1e-6)
    same = clipped_pg_loss(logp, behaviour, adv, mask, proximal_logp=behaviour, clip_eps=0.2)
    assert same.loss.item() == out.loss.item() and same.clip_ratio.item() == out.clip_ratio.item()


def test_clipped_pg_loss_clips_against_the_proximal_and_weights_by_the_behaviour():
    # the five tokens with their ratios to a proximal at 0.3; the behaviour is 1.5x less likely
    # still, so w = 1.5 < is_cap scales every term: loss 1.5 * -0.08 = -0.12, clip_ratio stays
    # 2/5 (against the behaviour, ratios 1.5, 2.25, 0.75, 0.75, 2.25, it would be 3/5)
    logp, _, adv, mask = _five_tokens()
    logp = (logp.detach() + 0.3).requires_grad_(True)
    proximal = torch.full((1, 5), 0.3)
    behaviour = proximal - math.log(1.5)
    out = clipped_pg_loss(logp, behaviour, adv, mask, proximal_logp=proximal, is_cap=2.0)
    assert out.loss.item() == pytest.approx(-0.12, abs=1e-6)
    assert out.clip_ratio.item() == pytest.approx(0.4)
    assert out.ratio_mean.item() == pytest.approx(1.0)
    assert out.behaviour_ratio_mean.item() == pytest.approx(1.5)
    assert out.is_weight_mean.item() == pytest.approx(1.5) and out.is_truncated.item() == 0.0
    out.loss.backward()
    assert logp.grad[0].tolist() == pytest.approx([-0.3, 0.0, 0.0, -0.15, 0.45], abs=1e-6)


def test_clipped_pg_loss_truncates_the_importance_weight_at_is_cap():
    # at the proximal (r = 1), A = +1; proximal / behaviour = 3, 1.5, 1 -> w = 2 (cut), 1.5, 1
    # loss = -(2 + 1.5 + 1) / 3 = -1.5; d loss / d logp = -w r A / 3
    proximal = torch.tensor([[-1.0, -2.0, -0.5]])
    behaviour = proximal - torch.log(torch.tensor([[3.0, 1.5, 1.0]]))
    logp = proximal.clone().requires_grad_(True)
    adv, mask = torch.ones(1), torch.ones(1, 3)
    out = clipped_pg_loss(logp, behaviour, adv, mask, proximal_logp=proximal, is_cap=2.0)
    assert out.loss.item() == pytest.approx(-1.5, abs=1e-6)
    assert out.is_weight_mean.item() == pytest.approx(1.5)
    assert out.is_truncated.item() == pytest.approx(1 / 3)
    assert out.clip_ratio.item() == 0.0 and out.ratio_mean.item() == 1.0
    out.loss.backward()
    assert logp.grad[0].tolist() == pytest.approx([-2 / 3, -0.5, -1 / 3], abs=1e-6)
    wide = clipped_pg_loss(logp, behaviour, adv, mask, proximal_logp=proximal, is_cap=4.0)
    assert wide.loss.item() == pytest.approx(-(3 + 1.5 + 1) / 3, abs=1e-6)
    assert wide.is_truncated.item() == 0.0


def test_clipped_pg_loss_ignores_masked_tokens_and_honours_normalizer():
    logp, behaviour, adv, mask = _five_tokens()

    def wide(t: torch.Tensor, v: float) -> torch.Tensor:
        return torch.cat([t.detach(), torch.tensor([[v]])], dim=1)

    logp6 = wide(logp, 30.0).requires_grad_(True)  # a masked token with an absurd ratio
    out = clipped_pg_loss(logp6, wide(behaviour, -30.0), wide(adv, 5.0), wide(mask, 0.0))
    assert out.loss.item() == pytest.approx(-0.08, abs=1e-6)
    out.loss.backward()
    assert logp6.grad[0, 5].item() == 0.0
    summed = clipped_pg_loss(logp, behaviour, adv, mask, normalizer=10.0)
    # the five tokens sum to -0.4; normalised over a 10-token batch
    assert summed.loss.item() == pytest.approx(-0.4 / 10, abs=1e-6)


def test_clipped_pg_loss_sequence_advantages_broadcast_like_token_advantages():
    logp = torch.randn(2, 3)
    behaviour = logp + 0.1 * torch.randn(2, 3)
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    per_seq = clipped_pg_loss(logp, behaviour, torch.tensor([1.0, -2.0]), mask)
    per_tok = clipped_pg_loss(logp, behaviour, torch.tensor([[1.0] * 3, [-2.0] * 3]), mask)
    assert per_seq.loss.item() == pytest.approx(per_tok.loss.item())


def test_clipped_pg_loss_kl_and_entropy_terms():
    # r = 1 and A = 0: only the penalties remain. k3(ln .5, ln .25) = 0.193147, times 0.1;
    # entropy 2.0 with coefficient 0.01 is subtracted: 0.0193147 - 0.02 = -0.0006853
    logp = torch.tensor([[math.log(0.5)]])
    out = clipped_pg_loss(
        logp,
        logp.clone(),
        torch.zeros(1),
        torch.ones(1, 1),
        ref_logp=torch.tensor([[math.log(0.25)]]),
        kl_coef=0.1,
        entropy=torch.tensor([[2.0]]),
        entropy_coef=0.01,
    )
    assert out.kl.item() == pytest.approx(0.193147, abs=1e-6)
    assert out.loss.item() == pytest.approx(0.1 * 0.193147 - 0.01 * 2.0, abs=1e-6)
    assert out.entropy.item() == 2.0 and out.pg_loss.item() == 0.0


def test_clipped_pg_loss_never_trains_the_behaviour_or_proximal_logprobs():
    logp = torch.zeros(1, 2, requires_grad=True)
    behaviour = torch.zeros(1, 2, requires_grad=True)
    proximal = torch.zeros(1, 2, requires_grad=True)
    out = clipped_pg_loss(logp, behaviour, torch.ones(1), torch.ones(1, 2), proximal_logp=proximal)
    out.loss.backward()
    assert behaviour.grad is None and proximal.grad is None and logp.grad is not None


def test_dpo_loss_is_log2_when_policy_equals_reference():
    logp = torch.tensor([-3.0, -7.5])
    out = dpo_loss(logp, logp - 1, logp, logp - 1, beta=0.1)
    assert out.loss.item() == pytest.approx(math.log(2))
    assert out.reward_margin.item() == 0.0 and out.accuracy.item() == 0.0


def test_dpo_loss_hand_values():
    # beta 0.5: chosen reward 0.5 * (-1 - -2) = 0.5, rejected 0.5 * (-3 - -2) = -0.5, margin 1
    # loss = -log sigmoid(1) = log(1 + e^-1) = 0.313262
    out = dpo_loss(
        torch.tensor([-1.0]),
        torch.tensor([-3.0]),
        torch.tensor([-2.0]),
        torch.tensor([-2.0]),
        beta=0.5,
    )
    assert out.loss.item() == pytest.approx(math.log(1 + math.exp(-1)), abs=1e-6)
    assert out.chosen_reward.tolist() == [0.5] and out.rejected_reward.tolist() == [-0.5]
    assert out.reward_margin.item() == 1.0 and out.accuracy.item() == 1.0


def test_dpo_gradient_raises_chosen_and_lowers_rejected():
    chosen = torch.tensor([-2.0], requires_grad=True)
    rejected = torch.tensor([-2.0], requires_grad=True)
    dpo_loss(chosen, rejected, torch.tensor([-2.0]), torch.tensor([-2.0])).loss.backward()
    assert chosen.grad.item() < 0 < rejected.grad.item()  # descent raises chosen, lowers rejected


def _sequence_sums(model, ids, attention, completion_mask) -> torch.Tensor:
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=attention).logits[:, :-1]  # (B, T-1, V)
    logp = torch.log_softmax(logits, -1).gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1)
    return (logp * completion_mask[:, 1:]).sum(-1)  # (B,)


def test_kto_loss_equals_trls_kto_trainer_on_the_same_batch(tmp_path):
    """TRL 1.16's KTOTrainer computes the loss of its collated batch; ours on the same tensors."""
    from datasets import Dataset
    from trl import KTOConfig, KTOTrainer

    from learner.policy.tiny_model import build_tiny_model

    model, tok = build_tiny_model(seed=0)
    ref, _ = build_tiny_model(seed=4)  # another start: non-zero log ratios and reference point
    rows = [
        ("What is 12 plus 30?", " The answer is 42.", True),
        ("hello there", " sorry no", False),
        ("What is 5 plus 3?", " 8", True),
        ("hi", " good bad correct", False),
    ]
    data = Dataset.from_list([{"prompt": p, "completion": c, "label": g} for p, c, g in rows])
    args = KTOConfig(
        output_dir=str(tmp_path),
        per_device_train_batch_size=4,
        beta=0.3,
        desirable_weight=1.0,
        undesirable_weight=1.5,
        bf16=False,
        gradient_checkpointing=False,
        use_cpu=True,
        report_to=[],
    )
    trainer = KTOTrainer(
        model=model, ref_model=ref, args=args, train_dataset=data, processing_class=tok
    )
    batch = next(iter(trainer.get_train_dataloader()))
    trl_loss = trainer.compute_loss(trainer.model, batch)

    def sums(m, prefix=""):
        return _sequence_sums(
            m,
            batch[prefix + "input_ids"],
            batch[prefix + "attention_mask"],
            batch[prefix + "completion_mask"],
        )

    z0 = kto_reference_point(sums(model, "KL_"), sums(ref, "KL_"))
    assert z0 > 0  # the precondition: the reference point is really exercised
    good = batch["label"].bool()
    ours = kto_loss(sums(model), sums(ref), good, z0, beta=0.3, weights=torch.where(good, 1.0, 1.5))
    assert ours.loss.item() == pytest.approx(trl_loss.item(), abs=1e-6)


def test_kto_loss_hand_values_and_direction():
    # r = [1, -1], z0 = 0.5, beta = 1: desirable 1 - s(0.5) = 0.377541; undesirable 1 - s(1.5) = 0.182426
    logp = torch.tensor([1.0, -1.0], requires_grad=True)
    out = kto_loss(logp, torch.zeros(2), torch.tensor([True, False]), torch.tensor(0.5), beta=1.0)
    s = lambda v: 1 / (1 + math.exp(-v))  # noqa: E731
    assert out.losses.tolist() == pytest.approx([1 - s(0.5), 1 - s(1.5)], abs=1e-6)
    out.loss.backward()
    assert logp.grad[0] < 0 and logp.grad[1] > 0  # descent raises the good answer, lowers the bad
    assert out.rewards.tolist() == pytest.approx([1.0, -1.0])


def test_kto_reference_point_is_a_clamped_detached_mean():
    assert kto_reference_point(torch.tensor([1.0, -3.0]), torch.zeros(2)).item() == 0.0
    kl = kto_reference_point(torch.tensor([2.0, 1.0], requires_grad=True), torch.zeros(2))
    assert kl.item() == 1.5 and not kl.requires_grad
