"""The shared-head forward of `completion_log_softmax`: the same values and gradients as one
forward per row, on the tiny model with a LoRA adapter (how the learner trains)."""

from __future__ import annotations

import warnings

import torch

import learner.logprobs as lp
from learner.logprobs import make_batch, selected_logprobs, shared_prefix
from learner.lora import attach_lora
from learner.policy.tiny_model import build_tiny_model

warnings.filterwarnings("ignore", category=FutureWarning)

HEAD = list(range(5, 45))  # 40 tokens every row opens with (a system prompt, an example)


def _rows():
    prompts = [HEAD + [50, 51], HEAD + [60, 61, 62, 63], HEAD + [70]]
    completions = [[80, 81, 82], [90, 91], [100, 101, 102, 103, 104]]
    masks = [[1, 1, 1], [1, 1], [1, 0, 1, 1, 1]]  # a tool reply spliced into the last one
    return prompts, completions, masks


def _forward(model, batch, shared: bool, monkeypatch):
    monkeypatch.setattr(lp, "MIN_SHARED_PREFIX", 1 if shared else 10**9)
    model.zero_grad()
    logp, entropy = selected_logprobs(model, batch, with_entropy=True, entropy_grad=True)
    (logp.sum() + 0.1 * entropy.sum()).backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return logp.detach(), entropy.detach(), grads


def test_the_shared_head_gives_the_values_and_gradients_of_one_forward_per_row(monkeypatch):
    model, tokenizer = build_tiny_model(seed=0)
    model = attach_lora(
        model, rank=4, alpha=8, dropout=0.0, targets=("q_proj", "v_proj", "down_proj")
    )
    with torch.no_grad():  # a trained adapter: B is zero at init, so its gradient path is live
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.02, generator=torch.Generator().manual_seed(1))
    prompts, completions, masks = _rows()
    batch = make_batch(prompts, completions, tokenizer.pad_token_id, masks)
    assert shared_prefix(batch, batch.completion_mask > 0) == len(HEAD)  # the head is found

    plain = _forward(model, batch, shared=False, monkeypatch=monkeypatch)
    shared = _forward(model, batch, shared=True, monkeypatch=monkeypatch)
    assert plain[0].shape == (3 + 2 + 4,)  # every completion token the masks keep
    torch.testing.assert_close(shared[0], plain[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(shared[1], plain[1], rtol=1e-5, atol=1e-5)
    assert plain[2] and set(shared[2]) == set(plain[2])  # the adapter's weights get gradient
    for name, g in plain[2].items():
        torch.testing.assert_close(shared[2][name], g, rtol=1e-4, atol=1e-6)


def test_no_head_is_shared_by_one_row_or_rows_that_differ_early():
    prompts, completions, _ = _rows()
    one = make_batch(prompts[:1], completions[:1], 0)
    assert shared_prefix(one, one.completion_mask > 0) == 0
    differ = make_batch([[1, *HEAD], [2, *HEAD]], completions[:2], 0)
    assert shared_prefix(differ, differ.completion_mask > 0) == 0
    # a row whose completion starts inside the others' head: the head stops before it
    short = make_batch([HEAD[:10], HEAD], [HEAD[10:12], [7]], 0)
    assert shared_prefix(short, short.completion_mask > 0) == 9
