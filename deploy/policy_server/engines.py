"""Which engine decodes for the policy server: llama.cpp where it can, else transformers."""

from __future__ import annotations

import importlib.util
import logging
import os
from dataclasses import dataclass
from typing import Any

from deploy.policy_server.settings import PolicyServerSettings
from learner.policy.generation.engine import GenerationEngine

log = logging.getLogger(__name__)
LLAMACPP, TRANSFORMERS = "llamacpp", "transformers"


class EngineUnavailable(RuntimeError):
    """The engine the settings ask for cannot run here; the message names the fix."""


@dataclass
class Engine:
    """The decoding engine, the loader that puts versions in its form, and their names."""

    name: str  # llamacpp | transformers
    label: str  # what responses and /healthz report: `llamacpp-f16`, `transformers-fp32`
    generation: GenerationEngine
    loader: Any  # versions.Loader; None: the VersionManager's own (transformers)


def choose_engine(settings: PolicyServerSettings) -> str:
    """`llamacpp` or `transformers` for these settings; `auto` logs why it took transformers."""
    if settings.policy_engine == TRANSFORMERS:
        return TRANSFORMERS
    problem = llamacpp_problem(settings)
    if problem is None:
        return LLAMACPP
    if settings.policy_engine == LLAMACPP:
        raise EngineUnavailable(f"ARLOOP_POLICY_ENGINE=llamacpp cannot run: {problem}")
    log.warning("policy engine: transformers, not llama.cpp: %s", problem)
    return TRANSFORMERS


def llamacpp_problem(settings: PolicyServerSettings) -> str | None:
    """Why llama.cpp cannot serve these settings, or None."""
    if importlib.util.find_spec("llama_cpp") is None:
        return (
            "llama-cpp-python is not installed (`pip install 'arloop[llamacpp]'`, a source "
            "build of about 10 CPU-minutes with a C++ compiler and cmake)"
        )
    if settings.device != "cpu":
        return f"the device is {settings.device!r} and llama-cpp-python is built for the CPU"
    from transformers import AutoConfig, AutoTokenizer

    from deploy.policy_server.llamacpp.to_gguf import ExportError, check_exportable
    from learner.policy.models import resolve_base

    source = resolve_base(settings.base_model, cache_dir=settings.model_cache)
    try:
        check_exportable(AutoConfig.from_pretrained(source), AutoTokenizer.from_pretrained(source))
    except ExportError as exc:
        return str(exc)
    except OSError:
        return None  # a base that does not load: the version manager says so, whatever the engine
    return None


def llamacpp_threads() -> int:
    """Half the cores (at least 1, at most 8): see `PolicyServerSettings.llamacpp_threads`."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, min(8, (cores or 2) // 2))


def build_engine(settings: PolicyServerSettings, on_batch) -> Engine:
    """The engine these settings choose, ready to start."""
    name = choose_engine(settings)
    window = settings.batch_window_ms / 1000
    if name == TRANSFORMERS:
        generation = GenerationEngine(
            settings.max_batch_size,
            window,
            on_batch=on_batch,
            prefix_entries=settings.prefix_cache,
            cache_alone=settings.prefix_cache_alone,
        )
        return Engine(TRANSFORMERS, "transformers-fp32", generation, None)
    from deploy.policy_server.llamacpp.engine import LlamaEngine
    from deploy.policy_server.llamacpp.loader import LlamaLoader

    loader = LlamaLoader(
        cache_dir=settings.model_cache,
        quant=settings.llamacpp_quant,
        slots=settings.max_batch_size,
        threads=settings.llamacpp_threads or llamacpp_threads(),
        context=settings.context_length,
    )
    generation = LlamaEngine(settings.max_batch_size, window, on_batch=on_batch, prefix_entries=0)
    return Engine(LLAMACPP, f"llamacpp-{settings.llamacpp_quant}", generation, loader)
