"""A tiny ChatML Llama built on the fly (BPE trained in a fraction of a second): the test model."""

from __future__ import annotations

from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from learner.policy.chatml import CHATML_TEMPLATE, SPECIAL_TOKENS

_CORPUS = [
    "The answer is 42. What is 12 plus 30? Use the calculator tool.",
    '<tool_call>{"name": "calculator", "arguments": {"expression": "12+30"}}</tool_call>',
    "A patient reports a headache and fever since yesterday. Triage: see a doctor.",
    "You are a helpful assistant. Think step by step, then write #### and the answer.",
    "0 1 2 3 4 5 6 7 8 9 + - * / ( ) = . , ? ! : ; ' \" { } [ ] < > # @ _",
    "user assistant system tool Hello hi yes no thanks good bad correct wrong sorry",
]


def build_tokenizer(vocab_size: int = 512) -> PreTrainedTokenizerFast:
    """A byte-level BPE over a small fixed corpus, wrapped with a ChatML chat template."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_CORPUS * 4, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|im_start|>",
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token="<|endoftext|>",
    )
    fast.chat_template = CHATML_TEMPLATE
    return fast


def build_tiny_model(seed: int = 0, hidden: int = 64, layers: int = 2):
    """(model, tokenizer): a 2-layer Llama small enough to train in milliseconds, fp32, eval mode."""
    tokenizer = build_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=hidden * 2,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=True,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).eval()
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    return model, tokenizer


def save_tiny_model(directory: Path, seed: int = 0) -> Path:
    """Write the tiny model and tokenizer as a normal Hugging Face folder (same seed, same bytes)."""
    model, tokenizer = build_tiny_model(seed)
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory
