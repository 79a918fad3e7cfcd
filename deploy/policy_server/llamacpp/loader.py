"""Registry versions for llama.cpp: exported once to GGUF (cached on disk), then loaded.

A version is exported from what the learner trains: `load_version` (fp32, any LoRA merged
into the base), written in the served quantisation. The file is named by a digest of the
checkpoint (its URI, kind, base, and its files' sizes and times), the quantisation and this
writer's version, so a restart, or a second server on the same cache, loads it without
exporting again; a checkpoint rewritten in place gets a new file. The cache keeps the most
recently used `keep` files.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from pathlib import Path
from typing import Any

from deploy.policy_server.llamacpp.runner import LlamaRunner
from deploy.policy_server.llamacpp.to_gguf import EOS_KEY, Quant, export_gguf, read_eos_ids
from deploy.policy_server.openai_wire import token_bytes
from learner.policy.models import (
    SMOLLM2,
    CheckpointError,
    checkpoint_path,
    load_version,
    load_version_tokenizer,
    resolve_base,
)
from learner.policy.registry import PolicyVersion
from learner.policy.storage import is_remote

log = logging.getLogger(__name__)
EXPORT_FORMAT = 2  # bump when export_gguf writes something different: old files are not reused
DEFAULT_CONTEXT = 4096
"""Tokens per sequence when the settings name none: the KV of every slot is reserved up front
(SmolLM2-135M: about 23 KB a token in f16, 8 slots x 4096 = 0.75 GB)."""
PRE_TOKENIZERS = {SMOLLM2: "smollm"}  # llama.cpp's name for a base's text splitting


class LlamaLoader:
    """The policy server's `Loader` for the llama.cpp engine: (LlamaRunner, HF tokenizer)."""

    def __init__(
        self,
        *,
        cache_dir: Path,
        quant: Quant,
        slots: int,
        threads: int,
        context: int | None = None,
        keep: int = 8,
    ) -> None:
        self.cache_dir, self.quant, self.slots = Path(cache_dir), quant, slots
        self.threads, self.context, self.keep = threads, context, keep
        self.folder = self.cache_dir / "gguf"

    def __call__(self, record: PolicyVersion) -> tuple[LlamaRunner, Any]:
        path = self.gguf_path(record)
        if path.exists():
            os.utime(path)  # most recently used: the last to be evicted
            tokenizer = load_version_tokenizer(record, cache_dir=self.cache_dir)
        else:
            tokenizer = self._export(record, path)
        runner = LlamaRunner(
            path, slots=self.slots, context=self.context or DEFAULT_CONTEXT, threads=self.threads
        )
        runner.eos = read_eos_ids(runner.meta(EOS_KEY)) or {tokenizer.eos_token_id}
        check_vocabulary(runner, tokenizer)
        return runner, tokenizer

    def gguf_path(self, record: PolicyVersion) -> Path:
        """Where this version's export lives (whether or not it exists yet)."""
        what = {
            "uri": record.checkpoint_uri,
            "kind": record.checkpoint_kind,
            "base": record.base_model,
            "files": self._files(record),
            "quant": self.quant,
            "format": EXPORT_FORMAT,
        }
        digest = hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:20]
        return self.folder / f"{record.version}-{digest}.{self.quant}.gguf"

    def _export(self, record: PolicyVersion, path: Path) -> Any:
        started = time.monotonic()
        model, tokenizer = load_version(record, cache_dir=self.cache_dir)
        self.folder.mkdir(parents=True, exist_ok=True)
        export_gguf(
            model,
            tokenizer,
            path,
            quant=self.quant,
            pre_tokenizer=PRE_TOKENIZERS.get(record.base_model, "default"),
            name=f"arloop {record.version}",
        )
        del model
        log.info(
            "exported %s to %s in %.1f s", record.version, path.name, time.monotonic() - started
        )
        self._evict(keep_path=path)
        return tokenizer

    def _files(self, record: PolicyVersion) -> Any:
        """What names the checkpoint's bytes: an `s3://` one's digest (its fetch, at export,
        checks it), else its files' names, sizes and times."""
        if is_remote(record.checkpoint_uri):
            return record.checkpoint_digest
        return _fingerprint(self._source(record))

    def _source(self, record: PolicyVersion) -> Path:
        uri = record.checkpoint_uri
        if uri.startswith("base:"):
            return Path(resolve_base(uri[len("base:") :], cache_dir=self.cache_dir))
        return checkpoint_path(uri)

    def _evict(self, keep_path: Path) -> None:
        """Remove all but the `keep` most recently used exports (never the one just written)."""
        files = sorted(self.folder.glob("*.gguf"), key=_mtime, reverse=True)
        for old in files[self.keep :]:
            if old != keep_path:
                old.unlink(missing_ok=True)


def check_vocabulary(runner: LlamaRunner, tokenizer: Any) -> None:
    """CheckpointError unless every id means the same bytes to llama.cpp and to the tokenizer.

    Prompts reach llama.cpp as the tokenizer's ids and its samples come back as ids the
    learner trains on: one id meaning two things would corrupt both, silently.
    """
    size = len(tokenizer)
    if runner.n_vocab < size:
        raise CheckpointError(
            f"{runner.path.name}: llama.cpp has {runner.n_vocab} tokens, the tokenizer {size}"
        )
    for token_id in range(size):
        if runner.piece(token_id) != token_bytes(tokenizer, token_id):
            raise CheckpointError(
                f"{runner.path.name}: token id {token_id} is {runner.piece(token_id)!r} to "
                f"llama.cpp but {token_bytes(tokenizer, token_id)!r} to the tokenizer; serve this "
                "model with ARLOOP_POLICY_ENGINE=transformers"
            )


def _fingerprint(folder: Path) -> list[tuple[str, int, int]]:
    """(name, size, mtime) of a checkpoint's files; empty for a folder not on disk (a hub id)."""
    if not folder.is_dir():
        return []
    return sorted(
        (p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in folder.iterdir() if p.is_file()
    )


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except FileNotFoundError:
        return 0.0
