"""The demo report's plots (matplotlib, no display): success and reward, KL, and length by version."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only: no display on a server
import matplotlib.pyplot as plt  # noqa: E402

from deploy.demo.report import Report  # noqa: E402


def plot_all(report: Report, folder: Path) -> list[Path]:
    """success_reward.png, kl.png and length.png in `folder`."""
    return [
        _success_reward(report, folder / "success_reward.png"),
        _kl(report, folder / "kl.png"),
        _length(report, folder / "length.png"),
    ]


def _axis(title: str, ylabel: str):
    fig, ax = plt.subplots(figsize=(6.4, 3.6), dpi=110)
    ax.set_title(title)
    ax.set_xlabel("policy version")
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    return fig, ax


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def _series(report: Report, attr: str) -> tuple[list[str], list[float]]:
    pairs = [(r.version, getattr(r, attr)) for r in report.versions]
    kept = [(v, x) for v, x in pairs if x is not None]
    return [v for v, _ in kept], [float(x) for _, x in kept]


def _success_reward(report: Report, path: Path) -> Path:
    fig, ax = _axis("Held-out success and user feedback by version", "rate / reward")
    rows = [r for r in report.versions if r.eval_n]
    if rows:
        rates = [r.eval_rate for r in rows]
        errors = [
            [r.eval_rate - r.eval_low for r in rows],
            [r.eval_high - r.eval_rate for r in rows],
        ]
        ax.errorbar(
            [r.version for r in rows],
            rates,
            yerr=errors,
            marker="o",
            capsize=4,
            label="held-out success (95% CI)",
        )
    for attr, label, style in (
        ("thumbs_up_rate", "thumbs-up rate of its traffic", "s--"),
        ("user_reward", "mean user reward of its traffic", "^:"),
    ):
        versions, values = _series(report, attr)
        if versions:
            ax.plot(versions, values, style, label=label)
    ax.set_ylim(-1.05, 1.05)
    ax.legend(loc="lower right", fontsize=8)
    return _save(fig, path)


def _kl(report: Report, path: Path) -> Path:
    fig, ax = _axis("KL to the base model", "nats per token")
    for attr, label, style in (
        ("kl", "on held-out completions (gate)", "o-"),
        ("train_kl", "during training (k3)", "s--"),
    ):
        versions, values = _series(report, attr)
        if versions:
            ax.plot(versions, values, style, label=label)
    ax.legend(fontsize=8)
    return _save(fig, path)


def _length(report: Report, path: Path) -> Path:
    fig, ax = _axis("Length of the final answer", "tokens (held-out runs)")
    versions, values = _series(report, "eval_answer_tokens")
    if versions:
        ax.bar(versions, values)
    return _save(fig, path)
