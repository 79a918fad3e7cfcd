"""A reward model learned from users' judgements: a bootstrap ensemble of logistic heads on
the frozen policy's hidden states (torch only; `learner.judge` wires it into a round).

Production leaves most runs unjudged. A run's features are the policy's last hidden states
over its final answer (their mean, and the last token's), standardised; each head is an
L2-regularised logistic regression fitted on a bootstrap resample of the judged runs, its
score 2 * sigmoid(logit) - 1 in [-1, 1]. The ensemble's mean is the score and the spread
between heads its doubt: `pessimistic` = mean - k * std, so a run unlike anything users judged
(where the heads disagree) scores low rather than high, the ensemble penalty that keeps a
policy from climbing a reward model's blind spots (Coste et al., 2023).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from agents.events import FeedbackEvent, TrajectoryEvent
from learner.logprobs import last_logits_only, make_batch
from learner.rewards import mean_score, scored

HELDOUT_SHARE = 0.25
"""Share of judged runs kept out of the fit to measure its AUROC (by a hash of the run's id)."""
L2 = 1e-2
"""Ridge penalty per head, on standardised features."""

Featurize = Callable[[list[list[int]], list[list[int]]], Tensor]
"""(prompt ids, completion ids) per run -> (N, D) features."""


@torch.no_grad()
def features(
    model: torch.nn.Module,
    prompts: Sequence[Sequence[int]],
    completions: Sequence[Sequence[int]],
    pad_id: int,
    batch_size: int = 8,
) -> Tensor:
    """(N, 2H) float64: mean and last hidden state of each completion's tokens, batch by batch."""
    out = []
    device = next(model.parameters()).device
    for i in range(0, len(prompts), batch_size):
        b = make_batch(prompts[i : i + batch_size], completions[i : i + batch_size], pad_id)
        hidden = model(
            input_ids=b.input_ids.to(device),
            attention_mask=b.attention_mask.to(device),
            output_hidden_states=True,
            **last_logits_only(model),
        ).hidden_states[-1]  # (B, T, H)
        # completion_mask[:, t] marks target t+1: shifted, it marks the completion's own tokens
        mask = torch.nn.functional.pad(b.completion_mask, (1, 0)).to(device)  # (B, T)
        mean = (hidden * mask.unsqueeze(-1)).sum(1) / mask.sum(1, keepdim=True).clamp(min=1)
        last = hidden[torch.arange(len(hidden)), (b.attention_mask.sum(1) - 1).to(device)]
        out.append(torch.cat([mean, last], dim=-1).double().cpu())  # (B, 2H)
    return torch.cat(out) if out else torch.zeros(0, 0, dtype=torch.float64)


class RewardEnsemble(torch.nn.Module):
    """K logistic heads over standardised features; scores in [-1, 1]."""

    def __init__(self, centre: Tensor, scale: Tensor, weight: Tensor, bias: Tensor) -> None:
        super().__init__()
        self.register_buffer("centre", centre)  # (D,)
        self.register_buffer("scale", scale)  # (D,)
        self.register_buffer("weight", weight)  # (K, D)
        self.register_buffer("bias", bias)  # (K,)

    @property
    def heads(self) -> int:
        return len(self.bias)

    def head_scores(self, x: Tensor) -> Tensor:
        """(N, K): each head's score of each run, 2 * sigmoid(logit) - 1."""
        z = (x.to(self.centre.dtype) - self.centre) / self.scale  # (N, D)
        return 2 * torch.sigmoid(z @ self.weight.T + self.bias) - 1  # (N, K)

    def scores(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """((N,) mean over heads, (N,) their spread, std over heads)."""
        s = self.head_scores(x)  # (N, K)
        return s.mean(1), s.std(1, unbiased=False)

    def pessimistic(self, x: Tensor, k: float) -> Tensor:
        """(N,) mean - k * spread, in [-1, 1]."""
        mean, spread = self.scores(x)
        return (mean - k * spread).clamp(-1.0, 1.0)


def fit_ensemble(x: Tensor, y: Tensor, heads: int, seed: int, l2: float = L2) -> RewardEnsemble:
    """Fit `heads` logistic regressions, each on a bootstrap resample of (x (N, D), y (N,) in [0, 1])."""
    x, y = x.double(), y.double()
    centre = x.mean(0)  # (D,)
    scale = x.std(0, unbiased=False).clamp(min=1e-6)  # (D,)
    z = (x - centre) / scale  # (N, D)
    gen = torch.Generator().manual_seed(seed)
    weights, biases = [], []
    for _ in range(heads):
        rows = torch.randint(len(z), (len(z),), generator=gen)  # (N,) with replacement
        w, b = _logistic(z[rows], y[rows], l2)
        weights.append(w)
        biases.append(b)
    return RewardEnsemble(centre, scale, torch.stack(weights), torch.stack(biases))


def _logistic(z: Tensor, y: Tensor, l2: float) -> tuple[Tensor, Tensor]:
    """((D,), ()) minimising mean cross-entropy + l2/2 |w|^2, by L-BFGS from zero (deterministic)."""
    w = torch.zeros(z.shape[1], dtype=z.dtype, requires_grad=True)
    b = torch.zeros((), dtype=z.dtype, requires_grad=True)
    opt = torch.optim.LBFGS([w, b], max_iter=200, line_search_fn="strong_wolfe")

    def closure() -> Tensor:
        opt.zero_grad()
        loss = torch.nn.functional.binary_cross_entropy_with_logits(z @ w + b, y)
        loss = loss + 0.5 * l2 * (w * w).sum()
        loss.backward()
        return loss

    with torch.enable_grad():
        opt.step(closure)
    return w.detach(), b.detach()


def auroc(scores: Sequence[float], positive: Sequence[bool]) -> float:
    """P(a positive outscores a negative), ties counted half; NaN without both classes."""
    pos = [s for s, p in zip(scores, positive, strict=True) if p]
    neg = [s for s, p in zip(scores, positive, strict=True) if not p]
    if not pos or not neg:
        return math.nan
    wins = sum(1.0 if a > b else 0.5 if a == b else 0.0 for a in pos for b in neg)
    return wins / (len(pos) * len(neg))


def run_target(feedback: Sequence[FeedbackEvent]) -> float | None:
    """A run's judgement in [-1, 1]: the mean score of its feedback (latest word per sender and
    kind, as rewards count it); None without a judgement (only corrections, or nothing)."""
    return mean_score(scored(feedback))


def heldout(trajectory_id: str) -> bool:
    """Whether a run is in the held-out share: fixed per run, so rounds measure alike."""
    digest = hashlib.sha256(trajectory_id.encode()).digest()
    return digest[0] < 256 * HELDOUT_SHARE


@dataclass(frozen=True)
class FitReport:
    """The fitted ensemble and how well it ranks runs it never saw."""

    model: RewardEnsemble
    auroc: float
    """Held-out AUROC of the ensemble's mean: good (judged > 0) runs above bad ones; NaN
    when the held-out runs lack a class."""
    train_runs: int
    heldout_runs: int
    heads: int


def fit_from_runs(
    runs: Sequence[tuple[TrajectoryEvent, Sequence[FeedbackEvent]]],
    featurize: Featurize,
    *,
    heads: int,
    seed: int,
    min_runs: int,
) -> FitReport | None:
    """Fit on judged runs (their last model step's logged ids); None below `min_runs` judged
    runs or without good and bad runs to fit on."""
    rows = []
    for t, fb in runs:
        target = run_target(fb)
        step = t.model_steps[-1] if t.model_steps else None
        if target is None or target == 0 or step is None:
            continue
        if step.prompt_token_ids and step.completion_token_ids:
            rows.append((t.event_id, step.prompt_token_ids, step.completion_token_ids, target))
    rows.sort(key=lambda r: r[0])  # the same fit whatever order the store returned them in
    if len(rows) < min_runs:
        return None
    train = [r for r in rows if not heldout(r[0])]
    test = [r for r in rows if heldout(r[0])]
    if len({r[3] > 0 for r in train}) < 2:
        return None
    x = featurize([r[1] for r in rows], [r[2] for r in rows])  # (N, D)
    at = {r[0]: i for i, r in enumerate(rows)}
    y = torch.tensor([(r[3] + 1) / 2 for r in train], dtype=torch.float64)  # (N_train,)
    model = fit_ensemble(x[[at[r[0]] for r in train]], y, heads, seed)
    score = math.nan
    if test:
        mean, _ = model.scores(x[[at[r[0]] for r in test]])
        score = auroc(mean.tolist(), [r[3] > 0 for r in test])
    return FitReport(model, score, len(train), len(test), heads)
