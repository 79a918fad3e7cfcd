"""Decision heads: a choice among a pack's labels (a triage level) read from the policy's
hidden states by a small classifier the learner fits on the labels users' feedback gives.

A 135M model that is told the four triage levels still writes the level of its one worked
example; the labels a clinic gives (5-15 a round) are too few to move its words, and enough
to start fitting a linear read-out of what its hidden states already hold. So a version may
carry, beside its weights, a head per decision (`heads.json` in its checkpoint folder):
multinomial logistic regression on the mean, over the tokens of the user's message (alone,
in the chat template), of one middle layer's hidden states of the *base* model. The base is
what no round changes, so every example ever labelled keeps its features and each version's
head is refitted on all of them (`learner.decision_heads`: the learner's store keeps them; a
prompt labelled again takes its latest label). Examples are kept as features and a digest of
the prompt, never its text.

The policy server answers `POST /v1/heads/{name}` with a version's head's label; an agent
whose spec names the decision (`agents.decisions.Decision`) puts that label into the model's
reply in place of its own (the pack's `apply`), before its verifier and its guard, which
still decide what is returned. What a head learns from N labels: `bench/bench_level_head.py`
(docs/medical.md, "Learning").
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

HEADS_FILE = "heads.json"
L2 = 1e-2
"""Ridge on the standardised features (chosen on the medical pack's train split)."""
MAX_EXAMPLES = 4096
"""Examples a head keeps (the most recent): its file stays a few MB."""


def head_layer(config: Any) -> int:
    """The hidden layer a head reads: just past the middle (16 of SmolLM2's 30), below the
    last (whose `hidden_states` entry has the final norm applied)."""
    layers = int(config.num_hidden_layers)
    return max(1, min(layers // 2 + 1, layers - 1))


def prompt_digest(prompt: str) -> str:
    """What an example keeps of its prompt: enough to replace its label, not to read it."""
    return hashlib.sha256(prompt.encode("utf-8")).hexdigest()[:32]


class _Reached(Exception):
    """Raised by the hook on the layer a head reads: the layers above it are not run."""

    def __init__(self, states: torch.Tensor) -> None:
        self.states = states


@torch.no_grad()
def features(
    model: torch.nn.Module, tokenizer: Any, texts: Sequence[str], layer: int
) -> torch.Tensor:
    """(N, H) float64: each text as a lone user message, its layer's hidden states averaged
    (`hidden_states[layer]`, the output of decoder layer `layer - 1`; nothing above it runs)."""

    def stop(module: Any, args: Any, output: Any) -> None:
        raise _Reached(output[0] if isinstance(output, tuple) else output)

    hook = model.model.layers[layer - 1].register_forward_hook(stop)
    rows = []
    try:
        for text in texts:  # one at a time: no padding, the same numbers in the server and here
            ids = tokenizer.apply_chat_template(
                [{"role": "user", "content": text}], return_tensors="pt", return_dict=True
            )["input_ids"][:, -2048:]  # (1, T)
            try:
                model(ids.to(model.device))
            except _Reached as reached:
                rows.append(reached.states.reshape(ids.shape[1], -1).mean(0).double().cpu())  # (H,)
    finally:
        hook.remove()
    return torch.stack(rows) if rows else torch.zeros(0, 0, dtype=torch.float64)


@dataclass
class Head:
    """One decision's classifier and the examples it was fitted on."""

    name: str
    labels: list[str]
    layer: int
    mean: list[float] = field(default_factory=list)
    scale: list[float] = field(default_factory=list)
    weight: list[list[float]] = field(default_factory=list)  # (H, K)
    bias: list[float] = field(default_factory=list)  # (K,)
    examples: list[dict[str, Any]] = field(default_factory=list)
    """{"prompt": digest, "label": ..., "x": features}, oldest first."""

    @property
    def fitted(self) -> bool:
        return bool(self.weight)

    def predict(self, x: torch.Tensor) -> tuple[str, dict[str, float]]:
        """(label, probability of each label) for one feature row (H,)."""
        mean, scale, weight, bias = (
            torch.tensor(v, dtype=torch.float64)
            for v in (self.mean, self.scale, self.weight, self.bias)
        )
        logits = ((x.double() - mean) / scale) @ weight + bias  # (K,)
        probs = torch.softmax(logits, dim=0)
        return self.labels[int(probs.argmax())], {
            k: round(float(p), 4) for k, p in zip(self.labels, probs, strict=True)
        }

    def with_examples(self, new: Sequence[tuple[str, str, torch.Tensor]]) -> Head:
        """A copy holding these (prompt digest, label, features) too; a prompt's latest wins."""
        kept = {e["prompt"]: e for e in self.examples}
        for prompt, label, x in new:
            if label in self.labels:
                kept.pop(prompt, None)
                kept[prompt] = {"prompt": prompt, "label": label, "x": [float(v) for v in x]}
        examples = list(kept.values())[-MAX_EXAMPLES:]
        return Head(self.name, list(self.labels), self.layer, examples=examples)


def fit(head: Head, l2: float = L2) -> Head:
    """The head's classifier fitted on its examples (deterministic: float64, full-batch
    L-BFGS from zeros); unfitted while its examples hold fewer than two labels."""
    if len({e["label"] for e in head.examples}) < 2:
        return Head(head.name, head.labels, head.layer, examples=head.examples)
    x = torch.tensor([e["x"] for e in head.examples], dtype=torch.float64)  # (N, H)
    y = torch.tensor([head.labels.index(e["label"]) for e in head.examples])  # (N,)
    mean = x.mean(0)
    scale = x.std(0, unbiased=False) + 1e-4
    xn = (x - mean) / scale
    w = torch.zeros(x.shape[1], len(head.labels), dtype=torch.float64, requires_grad=True)
    b = torch.zeros(len(head.labels), dtype=torch.float64, requires_grad=True)
    opt = torch.optim.LBFGS([w, b], max_iter=200, line_search_fn="strong_wolfe")

    def loss() -> torch.Tensor:
        opt.zero_grad()
        value = torch.nn.functional.cross_entropy(xn @ w + b, y) + l2 * (w**2).sum()
        value.backward()
        return value

    opt.step(loss)
    return Head(
        head.name,
        head.labels,
        head.layer,
        mean=mean.tolist(),
        scale=scale.tolist(),
        weight=w.detach().tolist(),
        bias=b.detach().tolist(),
        examples=head.examples,
    )


def read_heads(folder: Path | None) -> dict[str, Head]:
    """A checkpoint folder's heads by name (none: no file, or a base version)."""
    if folder is None or not (Path(folder) / HEADS_FILE).is_file():
        return {}
    data = json.loads((Path(folder) / HEADS_FILE).read_text(encoding="utf-8"))
    return {
        name: Head(name=name, **{k: v for k, v in h.items() if k != "name"})
        for name, h in data.items()
    }


def write_heads(folder: Path, heads: dict[str, Head]) -> None:
    """Write the heads into a checkpoint folder being saved (before its digest is taken)."""
    if heads:
        data = {name: vars(h) for name, h in heads.items()}
        (Path(folder) / HEADS_FILE).write_text(json.dumps(data), encoding="utf-8")
