"""A Hugging Face Llama-architecture model and its byte-level BPE tokenizer as a GGUF file.

What `convert_hf_to_gguf.py` of llama.cpp does for `LlamaForCausalLM`, in the few lines our
models need: tensor names from `gguf`'s map, q/k rows permuted to llama.cpp's rotary layout,
2-D weights in the chosen type (norms stay F32), the vocabulary in the tokenizer's own id order
(so llama.cpp's token ids are the tokenizer's), its merges and special tokens.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Literal

import gguf
import numpy as np
import torch
from gguf.quants import quantize

from learner.policy.generation.engine import eos_ids

Quant = Literal["q4_0", "q4_1", "q8_0", "f16", "f32"]
QUANT_TYPES = {
    "q4_0": (gguf.GGMLQuantizationType.Q4_0, gguf.LlamaFileType.MOSTLY_Q4_0),
    "q4_1": (gguf.GGMLQuantizationType.Q4_1, gguf.LlamaFileType.MOSTLY_Q4_1),  # as shipped
    "q8_0": (gguf.GGMLQuantizationType.Q8_0, gguf.LlamaFileType.MOSTLY_Q8_0),
    "f16": (gguf.GGMLQuantizationType.F16, gguf.LlamaFileType.MOSTLY_F16),
    "f32": (gguf.GGMLQuantizationType.F32, gguf.LlamaFileType.ALL_F32),
}
EXPORTABLE = ("llama",)  # config.model_type values this writer knows
EOS_KEY = "arloop.eos_token_ids"
"""Every id that ends a turn for the Hugging Face model (its generation config's and the
tokenizer's): the engine stops on exactly these, as the transformers engine does."""


class ExportError(RuntimeError):
    """The model cannot be written for llama.cpp; the message says why and what to use."""


def check_exportable(config: Any, tokenizer: Any) -> None:
    """ExportError unless `export_gguf` can write this model and tokenizer."""
    kind = getattr(config, "model_type", None)
    if kind not in EXPORTABLE:
        raise ExportError(
            f"the llama.cpp engine serves Llama-architecture models; this one is {kind!r}: "
            "set ARLOOP_POLICY_ENGINE=transformers"
        )
    if _rope(config).get("rope_type", "default") != "default":
        raise ExportError("rope scaling is not exported for llama.cpp: use the transformers engine")
    if _tokenizer_json(tokenizer)["model"].get("type") != "BPE":
        raise ExportError(
            "the llama.cpp export writes byte-level BPE tokenizers only: use the transformers engine"
        )


def export_gguf(
    model: torch.nn.Module,
    tokenizer: Any,
    path: Path,
    *,
    quant: Quant = "f16",
    pre_tokenizer: str = "default",
    name: str = "arloop policy",
) -> Path:
    """Write `model` (fp32, any LoRA merged) and `tokenizer` to `path`, atomically."""
    config = model.config
    check_exportable(config, tokenizer)
    qtype, file_type = QUANT_TYPES[quant]
    partial = path.with_name(path.name + f".{os.getpid()}.partial")
    writer = gguf.GGUFWriter(partial, "llama")
    _write_header(writer, config, name, file_type)
    _write_vocab(writer, tokenizer, config.vocab_size, pre_tokenizer)
    # a string, not an array: llama.cpp hands scalar metadata back (`LlamaRunner.meta`) and
    # skips arrays, and reading an array back with gguf's reader parses the whole vocabulary
    writer.add_string(EOS_KEY, ",".join(str(i) for i in sorted(eos_ids(model, tokenizer))))
    for gguf_name, data in _tensors(model):
        if data.ndim == 2 and qtype is not gguf.GGMLQuantizationType.F32:
            writer.add_tensor(gguf_name, quantize(data, qtype), raw_dtype=qtype)
        else:
            writer.add_tensor(gguf_name, data)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    partial.rename(path)
    return path


def read_eos_ids(text: str | None) -> set[int]:
    """The eos ids `export_gguf` wrote (`LlamaRunner.meta(EOS_KEY)`); empty for a file
    written elsewhere."""
    return {int(i) for i in text.split(",")} if text else set()


def _write_header(writer: gguf.GGUFWriter, config: Any, name: str, file_type: int) -> None:
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    writer.add_name(name)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(heads)
    writer.add_head_count_kv(config.num_key_value_heads or heads)
    writer.add_rope_dimension_count(head_dim)
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_rope_freq_base(float(_rope(config).get("rope_theta", 10000.0)))
    writer.add_layer_norm_rms_eps(float(config.rms_norm_eps))
    writer.add_vocab_size(config.vocab_size)
    writer.add_file_type(file_type)
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)


def _write_vocab(writer: gguf.GGUFWriter, tokenizer: Any, size: int, pre: str) -> None:
    """Tokens by id (padded to the model's vocab size), their types, merges, special ids."""
    by_id = {i: t for t, i in tokenizer.get_vocab().items()}
    added = tokenizer.added_tokens_decoder  # id -> AddedToken
    tokens, types = [], []
    for i in range(size):
        token = by_id.get(i)
        if token is None:
            tokens.append(f"[PAD{i}]")
            types.append(gguf.TokenType.UNUSED)
        elif i in added:
            tokens.append(token)
            types.append(
                gguf.TokenType.CONTROL if added[i].special else gguf.TokenType.USER_DEFINED
            )
        else:
            tokens.append(token)
            types.append(gguf.TokenType.NORMAL)
    merges = _tokenizer_json(tokenizer)["model"].get("merges", [])
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in merges])
    for setter, token_id in (
        (writer.add_bos_token_id, tokenizer.bos_token_id),
        (writer.add_eos_token_id, tokenizer.eos_token_id),
        (writer.add_unk_token_id, tokenizer.unk_token_id),
        (writer.add_pad_token_id, tokenizer.pad_token_id),
    ):
        if token_id is not None:
            setter(token_id)
    writer.add_add_bos_token(False)  # the chat template writes the special tokens itself
    if tokenizer.chat_template:
        writer.add_chat_template(tokenizer.chat_template)


def _tensors(model: torch.nn.Module):
    """(gguf name, float32 array) per weight; q/k permuted as llama.cpp's rope expects."""
    config = model.config
    heads, kv_heads = (
        config.num_attention_heads,
        config.num_key_value_heads or config.num_attention_heads,
    )
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, config.num_hidden_layers)
    state = model.state_dict()
    tied = getattr(config, "tie_word_embeddings", False)
    for hf_name, tensor in state.items():
        if hf_name.endswith("rotary_emb.inv_freq") or (tied and hf_name == "lm_head.weight"):
            continue
        gguf_name = names.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        if gguf_name is None:
            raise ExportError(f"no GGUF name for tensor {hf_name!r}: use the transformers engine")
        data = tensor.detach().to(torch.float32).cpu().numpy()
        if hf_name.endswith("q_proj.weight"):
            data = _permute(data, heads)
        elif hf_name.endswith("k_proj.weight"):
            data = _permute(data, kv_heads)
        yield gguf_name, np.ascontiguousarray(data)


def _permute(weights: np.ndarray, heads: int) -> np.ndarray:
    """HF's rotate-half rows to llama.cpp's interleaved pairs (convert_hf_to_gguf's permute)."""
    rows = weights.shape[0]
    return (
        weights.reshape(heads, 2, rows // heads // 2, *weights.shape[1:])
        .swapaxes(1, 2)
        .reshape(weights.shape)
    )


def _rope(config: Any) -> dict[str, Any]:
    """Rope settings: transformers 5's `rope_parameters`, else the older separate fields."""
    rope = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None)
    rope = dict(rope or {})
    if "rope_theta" not in rope and getattr(config, "rope_theta", None) is not None:
        rope["rope_theta"] = config.rope_theta
    return rope


def _tokenizer_json(tokenizer: Any) -> dict[str, Any]:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        raise ExportError("the llama.cpp export needs a fast (tokenizers) tokenizer")
    return json.loads(backend.to_str())
