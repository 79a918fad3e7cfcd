"""Helpers of the policy server tests: a live server on a free port, and perturbed checkpoints."""

from __future__ import annotations

import importlib.util
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch
import uvicorn

from deploy.embedded_redis import free_port
from deploy.policy_server.app import PolicyServer, create_app
from deploy.policy_server.settings import PolicyServerSettings
from learner.policy.models import load_base
from learner.policy.registry import CHAMPION, PolicyRegistry, PolicyVersion
from tests.model_cache import MODEL_CACHE

needs_llamacpp = pytest.mark.skipif(
    importlib.util.find_spec("llama_cpp") is None,
    reason="llama-cpp-python is not installed (`pip install 'arloop[llamacpp]'`)",
)
ENGINES = [
    pytest.param("transformers", id="transformers"),
    pytest.param("llamacpp", id="llamacpp", marks=needs_llamacpp),
]
"""Parametrise a server fixture or test with this to run it against both engines."""


def tiny_settings(redis_url: str, **overrides) -> PolicyServerSettings:
    """Settings for a tiny-model server on a free port, following the registry quickly.

    The transformers engine unless `policy_engine` says otherwise: its logprobs are exactly
    the learner's, which the tests outside the policy server's own rely on. llama.cpp serves an
    F16 export, not the default Q8_0: the tests compare its logprobs with the learner's to 5e-3
    (Q8_0's export is tested in test_llamacpp.py, and served by the stacks the demo starts).
    """
    values = {
        "redis_url": redis_url,
        "base_model": "tiny",
        "port": free_port(),
        "reload_poll_s": 0.5,
        "batch_window_ms": 5.0,
        "max_tokens_cap": 64,
        "clamp_max_tokens": True,  # the agents' 512 tokens do not fit the tiny model's 512
        "threads": 1,
        "policy_engine": "transformers",
        "llamacpp_quant": "f16",
    }
    return PolicyServerSettings(**{**values, **overrides})


@contextmanager
def running_server(
    settings: PolicyServerSettings, *, uvicorn_options: dict | None = None, **app_kwargs
) -> Iterator[str]:
    """`create_app(settings)` served as `arloop serve policy` serves it, in a thread; yields the
    `/v1` base URL."""
    with serving(settings, uvicorn_options=uvicorn_options, **app_kwargs) as (base, _, _):
        yield base


@contextmanager
def serving(
    settings: PolicyServerSettings, *, uvicorn_options: dict | None = None, **app_kwargs
) -> Iterator[tuple[str, PolicyServer, threading.Thread]]:
    """`running_server`, also yielding the server (`should_exit = True` is what SIGTERM does)
    and the thread it runs on."""
    app = create_app(settings, **app_kwargs)
    config = uvicorn.Config(
        app,
        host="127.0.0.1",
        port=settings.port,
        **({"log_level": "warning", "lifespan": "on"} | (uvicorn_options or {})),
    )
    server = PolicyServer(config, app.state.admission)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("policy server did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{settings.port}/v1", server, thread
    finally:
        server.should_exit = True
        thread.join(timeout=30)


def make_lora(directory: Path, seed: int, scale: float = 0.5) -> Path:
    """A LoRA adapter over the tiny base with random (nonzero) B: a visibly different policy."""
    from peft import LoraConfig, get_peft_model

    base, _ = load_base("tiny", cache_dir=MODEL_CACHE)
    torch.manual_seed(seed)
    config = LoraConfig(
        r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"], init_lora_weights=False
    )
    peft_model = get_peft_model(base, config)
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_" in name:
                p.mul_(scale / max(p.abs().mean().item(), 1e-6))
    peft_model.save_pretrained(directory)
    return directory


def make_full(directory: Path, seed: int, scale: float = 0.05, model=None) -> Path:
    """The tiny base (or `model`) with every weight perturbed, saved as a full checkpoint."""
    base, tokenizer = load_base("tiny", cache_dir=MODEL_CACHE)
    model = model or base
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * scale)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def publish(registry: PolicyRegistry, kind: str, folder: Path, *, champion: bool = True) -> str:
    """Register a checkpoint folder as the next version and (by default) make it champion."""
    version = registry.next_version()
    record = PolicyVersion(
        version=version,
        parent=None,
        base_model="tiny",
        checkpoint_uri=folder.resolve().as_uri(),
        checkpoint_kind=kind,
    )
    registry.publish(record)
    if champion:
        registry.promote(
            version, expect=registry.aliases().get(CHAMPION), reason="test", actor="test"
        )
    return version


def train_to_say(model, tokenizer, pairs: list[tuple[list[int], str]], steps: int = 150):
    """Make greedy decoding of each prompt give its text then <|im_end|>; returns the final loss.

    Only the last decoder layer and the final norm learn: nothing upstream of them changes, so
    that layer's inputs are computed once and training costs a fraction of a second.
    """
    from learner.logprobs import make_batch

    completions = [
        tokenizer(t, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        for _, t in pairs
    ]
    batch = make_batch([p for p, _ in pairs], completions, tokenizer.pad_token_id)
    layer, inner = model.model.layers[-1], model.model
    seen = {}

    def capture(module, args, kwargs):
        seen.update(h=(args[0] if args else kwargs["hidden_states"]).detach(), kwargs=kwargs)

    hook = layer.register_forward_pre_hook(capture, with_kwargs=True)
    with torch.no_grad():
        model(input_ids=batch.input_ids, attention_mask=batch.attention_mask)
    hook.remove()
    kwargs = {
        k: seen["kwargs"][k]
        for k in ("attention_mask", "position_embeddings", "position_ids")
        if k in seen["kwargs"]
    }
    keep = batch.completion_mask > 0  # (B, T-1)
    targets = batch.input_ids[:, 1:][keep]  # (N,)
    optim = torch.optim.Adam(list(layer.parameters()) + list(inner.norm.parameters()), lr=3e-3)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # small ops: threads only contend on a shared machine
    try:
        loss = _fit(
            layer, inner.norm, model.lm_head, seen["h"], kwargs, keep, targets, optim, steps
        )
    finally:
        torch.set_num_threads(threads)
    return model.eval(), loss


def _fit(layer, norm, head, h, kwargs, keep, targets, optim, steps: int) -> float:
    for _ in range(steps):
        out = layer(h, **kwargs)  # (B, T, D)
        out = out[0] if isinstance(out, tuple) else out
        logits = head(norm(out[:, :-1][keep])).float()  # (N, V)
        loss = torch.nn.functional.cross_entropy(logits, targets)
        optim.zero_grad()
        loss.backward()
        optim.step()
    return loss.item()
