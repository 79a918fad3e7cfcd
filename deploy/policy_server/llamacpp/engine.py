"""Continuous batching on llama.cpp: every row of one version is a sequence of one context.

The queue, the batch window, cancellation and "versions never mix" are the transformers
engine's (`GenerationEngine`); what differs is the forward pass. Each step feeds one
`llama_decode` call: the last sampled token of every running row, plus the prompt (after the
head its slot already holds, or has copied from another slot) of every row that joins now.
Rows with the same prompt (the n choices of one request, the k samples of one eval task)
join one step apart: the first prefills it, the others copy its KV. The rows then sample from the
logits exactly as the transformers engine's rows do (`rows.step`: temperature, top-p, seed
per choice, logprobs of the model's own distribution, stop strings, stop lines).
"""

from __future__ import annotations

from typing import Any

import torch

from deploy.policy_server.llamacpp.runner import Feed, LlamaRunner
from learner.policy.generation.engine import GenerationEngine
from learner.policy.generation.rows import Row, step

CPU = torch.device("cpu")


class LlamaEngine(GenerationEngine):
    """`GenerationEngine`'s queue over llama.cpp; a policy's `.model` is a `LlamaRunner`."""

    def _generate(self, rows: list[Row]) -> None:
        policy = rows[0].policy if rows else None
        if policy is None:
            return
        runner: LlamaRunner = policy.model
        eos = runner.eos or {policy.tokenizer.eos_token_id}
        slots: dict[int, Row] = {}  # slot -> the row decoding in it
        joining = rows
        while joining or slots:
            feeds, stepping = self._last_tokens(slots)
            claimed: set[int] = set()
            prompts: set[tuple[int, ...]] = set()
            later: list[Row] = []  # the same prompt as a row joining now: copies its KV next step
            for row in joining:
                prompt = tuple(row.prompt_ids)
                if prompt in prompts:
                    later.append(row)
                    continue
                free = [s for s in range(runner.slots) if s not in slots]
                donors = [s for s in range(runner.slots) if s not in claimed]
                slot, keep = runner.claim(free, row.prompt_ids, donors)
                claimed.add(slot)
                prompts.add(prompt)
                row.seed_generator(CPU)
                slots[slot] = row
                feeds.append(Feed(slot, row.prompt_ids[keep:]))
                stepping.append(row)
            if stepping:
                self._decode_step(runner, policy.tokenizer, eos, feeds, stepping, slots)
            for slot, row in list(slots.items()):
                if row.finish_reason is not None or row.cancelled:
                    del slots[slot]
            room = min(runner.slots, self.max_batch_size) - len(slots) - len(later)
            joining = later + self._joiners(policy, room)
            self._active = list(slots.values()) + joining

    @staticmethod
    def _last_tokens(slots: dict[int, Row]) -> tuple[list[Feed], list[Row]]:
        """Each running row's last sampled token, to feed next."""
        feeds = [Feed(slot, row.token_ids[-1:]) for slot, row in slots.items()]
        return feeds, list(slots.values())

    def _decode_step(
        self,
        runner: LlamaRunner,
        tokenizer: Any,
        eos: set[int],
        feeds: list[Feed],
        rows: list[Row],
        slots: dict[int, Row],
    ) -> None:
        self._observe(len(rows))
        try:
            logits = runner.decode(feeds)  # (B, V)
        except Exception:
            for feed in feeds:  # their KV is not what the runner thinks: start them afresh
                runner.reset(feed.slot)
            raise
        step(rows, torch.from_numpy(logits), tokenizer, eos)
