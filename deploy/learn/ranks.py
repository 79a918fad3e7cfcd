"""The learner under `accelerate launch` (or torchrun): rank 0 leads, the other ranks train.

Rank 0 is the learner: it alone holds the lease, reads Redis, owns the store and its ledger,
forms each round's batches (in `content_key` order) and publishes. The other ranks hold no
Redis connection and no store; they follow rank 0's commands, broadcast with
`torch.distributed.broadcast_object_list`:

    ("round", parent, train config, model cache, adapter dir, optimizer state)
        every rank loads the parent and builds its `PolicyTrainer` (DDP through accelerate)
    ("pg" | "kto" | "dpo", batch, ...)
        every rank gets the same whole batch, trains its shard `batch[rank::world]`, and
        the gradients are all-reduced by DDP: one update, the same weights on every rank
    ("save",)   the ranks' weights are compared (a digest each) before rank 0 writes them
    ("end",)    the round is over (done or failed): the followers drop their trainer
    ("idle",)   rank 0's heartbeat between commands, from a thread, so a follower waiting
                for the next round never waits past the collective timeout
    ("stop",)   the launch ends

Exactly-once holds because only rank 0 writes what counts: the ledger commit that settles a
round's events is rank 0's publish, after every rank trained. A rank killed mid-round breaks
the collectives: the others get an error from gloo/NCCL at once (a closed connection), or
after `collective_timeout_s` (a frozen peer), and exit with a message saying so; rank 0 has
committed nothing, so the events stay trainable and a restarted launch (or a lone learner,
which takes over the dead holder's lease) trains them once.
"""

from __future__ import annotations

import hashlib
import logging
import os
import signal
import threading
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from rich.markup import escape

from learner.config import TrainConfig
from learner.crashpoints import crash_point
from learner.policy.registry import PolicyVersion
from learner.train_step import PolicyTrainer

log = logging.getLogger("arloop.learner")

LAUNCH_LINE = "accelerate launch --multi_gpu --num_processes 2 -m deploy.cli learn"
"""How to start the learner on 2 processes (GPUs, or CPU processes on a machine without one)."""

STEPS = {"pg": "step", "kto": "kto_step", "dpo": "dpo_step"}
"""Command -> the `PolicyTrainer` method every rank runs on the broadcast batch."""


class PeerLost(RuntimeError):
    """A collective failed: another rank died or stopped answering; this launch cannot go on."""


class RanksDiverged(RuntimeError):
    """The ranks' weights differ after a round: nothing is published."""


def launch_rank() -> tuple[int, int]:
    """(rank, world size) from the launcher's environment; (0, 1) without one."""
    world = os.environ.get("WORLD_SIZE", "1")
    rank = os.environ.get("RANK") or os.environ.get("LOCAL_RANK") or "0"
    if not (world.isdigit() and rank.isdigit()):
        return 0, 1
    return int(rank), max(int(world), 1)


def join(timeout_s: float) -> None:
    """Join the launch's process group (gloo on CPU, NCCL on GPUs) with a collective timeout.

    accelerate's shared state is initialised here first, so the `Accelerator()` of each
    `PolicyTrainer` reuses this group. On a machine without a GPU it is told `cpu=True`:
    `accelerate launch --multi_gpu` starts the ranks through torchrun, and accelerate's own
    `--cpu` flag starts one process unless mpirun is configured."""
    from accelerate import PartialState

    cpu = not torch.cuda.is_available()
    PartialState(cpu=cpu, timeout=timedelta(seconds=timeout_s))


def collective_error(exc: BaseException) -> bool:
    """Whether an exception is a failed collective (a peer gone, a timeout), not a bad batch."""
    if isinstance(exc, dist.DistError):
        return True
    text = str(exc)
    markers = ("gloo", "Connection reset", "Connection closed", "timed out", "NCCL", "Timed out")
    return isinstance(exc, RuntimeError) and any(m in text for m in markers)


def _broadcast(command: tuple | None) -> tuple:
    box = [command]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def weights_digest(trainer: PolicyTrainer) -> str:
    """A digest of the trained parameters' bytes (DDP keeps them bit-identical on every rank)."""
    h = hashlib.sha256()
    for p in trainer.model.parameters():
        if p.requires_grad:
            h.update(p.detach().to("cpu", torch.float32).contiguous().numpy().tobytes())
    return h.hexdigest()


class Team:
    """Rank 0's side: sends commands to the other ranks, one at a time, and keeps them alive."""

    def __init__(
        self,
        world: int,
        timeout_s: float,
        on_lost: Callable[[str], None],
        say: Callable[[str], None] = lambda line: None,
    ) -> None:
        self.world = world
        self.say = say
        self.timeout_s = timeout_s
        self.on_lost = on_lost
        self.lost: str | None = None
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._stopped = False
        self._heart = threading.Thread(target=self._beat, name="arloop-heartbeat", daemon=True)
        self._heart.start()

    def command(self, command: tuple, then: Callable[[], Any] = lambda: None) -> Any:
        """Broadcast `command` and run rank 0's part of it (`then`) under the same lock, so a
        heartbeat never lands between a command and the collectives it implies."""
        with self._lock:
            if self.lost is not None:
                raise PeerLost(self.lost)
            if self._stopped:  # a heartbeat that waited on the lock while "stop" went out
                return None
            try:
                _broadcast(command)
                return then()
            except Exception as exc:
                if collective_error(exc):
                    raise self._lose(command[0], exc) from exc
                raise

    def make_trainer(
        self,
        parent: PolicyVersion,
        model: torch.nn.Module,
        pad_id: int,
        train: TrainConfig,
        model_cache: Path,
        adapter_dir: Path | None,
        optimizer_state: Path | None,
    ) -> LeaderTrainer:
        """Start the round on every rank: each builds its trainer from the same parent."""
        start = ("round", parent, train, model_cache, adapter_dir, optimizer_state)

        def build() -> PolicyTrainer:
            return PolicyTrainer(
                model, pad_id, train, adapter_dir=adapter_dir, optimizer_state=optimizer_state
            )

        return LeaderTrainer(self, self.command(start, build))

    def round_over(self) -> None:
        """The round is done or failed: the followers drop their trainer."""
        if self.lost is None:
            self.command(("end",))

    def close(self) -> None:
        """End the launch: the followers exit, the heartbeat stops."""
        self._closed.set()
        if self.lost is None:
            try:  # flagged under the command's lock: no heartbeat after "stop"
                self.command(("stop",), lambda: setattr(self, "_stopped", True))
            except PeerLost:
                return
            self._heart.join(timeout=self.timeout_s)
            dist.destroy_process_group()

    def _beat(self) -> None:
        every = max(0.5, min(self.timeout_s / 5, 30.0))
        while not self._closed.wait(every):
            try:
                self.command(("idle",))
            except Exception as exc:  # noqa: BLE001 - a silent heartbeat would time the others out
                self.on_lost(str(exc))
                return

    def _lose(self, what: str, exc: BaseException) -> PeerLost:
        self.lost = (
            f"a rank of this {self.world}-process launch is gone (during {what!r}: "
            f"{str(exc).splitlines()[0][:300]}); rank 0 publishes nothing more, and every event "
            "no published version names stays trainable: restart the launch"
        )
        log.error(self.lost)
        self.say(f"[red]arloop learn:[/] {escape(self.lost)}")  # now: the launcher may SIGKILL
        return PeerLost(self.lost)


class LeaderTrainer:
    """Rank 0's trainer: each update and the save first tell the other ranks to do the same."""

    def __init__(self, team: Team, trainer: PolicyTrainer) -> None:
        self._team = team
        self._trainer = trainer

    def __getattr__(self, name: str) -> Any:
        return getattr(self._trainer, name)  # model, frozen_view: rank 0's own

    def step(self, samples: list, current_version: int | None = None) -> dict[str, float]:
        return self._run("pg", samples, current_version=current_version)

    def kto_step(self, examples: list) -> dict[str, float]:
        return self._run("kto", examples)

    def dpo_step(self, pairs: list) -> dict[str, float]:
        return self._run("dpo", pairs)

    def save(self, directory: Path) -> None:
        """Refuse to write weights that differ between ranks; then rank 0 writes them."""

        def check_and_save() -> None:
            digests = [None] * self._team.world
            dist.all_gather_object(digests, weights_digest(self._trainer))
            self._team.say(f"rank 0: trained weights sha256 {digests[0][:16]}")
            if len(set(digests)) != 1:
                raise RanksDiverged(
                    f"the ranks' weights differ after the round ({len(set(digests))} digests): "
                    "nothing published; the events stay trainable"
                )
            self._trainer.save(directory)

        self._team.command(("save",), check_and_save)

    def _run(self, kind: str, items: list, **kw: Any) -> dict[str, float]:
        method = getattr(self._trainer, STEPS[kind])
        return self._team.command((kind, items, kw), lambda: method(items, **kw))


def follow(rank: int, timeout_s: float, print_line: Callable[[str], None]) -> int:
    """A rank > 0: train what rank 0 sends until it says stop; the exit code."""
    from learner.rounds import RoundPlan, load_parent

    def say(line: str) -> None:  # errors quote paths in brackets, which rich reads as markup
        print_line(escape(line))

    trainer: PolicyTrainer | None = None
    # rank 0 decides when the launch stops (it finishes or abandons the round, then says
    # "stop"); the launcher's SIGTERM and a terminal's Ctrl-C reach every rank at once
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, frame: None)
    say(f"rank {rank}: following rank 0 (it reads Redis, keeps the ledger and publishes)")
    while True:
        try:
            command = _broadcast(None)
        except Exception as exc:
            if not collective_error(exc):
                raise
            say(f"rank {rank}: rank 0 is gone or silent past {timeout_s:g} s ({exc}); exiting")
            return 3
        kind = command[0]
        if kind == "stop":
            dist.destroy_process_group()
            return 0
        try:
            if kind == "round":
                parent, train, cache, adapter_dir, optimizer_state = command[1:]
                plan = RoundPlan(checkpoints_dir=Path(), model_cache=cache, train=train)
                model, tokenizer, _ = load_parent(parent, plan)
                trainer = PolicyTrainer(
                    model, tokenizer.pad_token_id, train, adapter_dir, optimizer_state
                )
            elif kind in STEPS and trainer is not None:
                crash_point(f"rank{rank}_{kind}")  # the kill -9 tests' point
                getattr(trainer, STEPS[kind])(command[1], **command[2])
            elif kind == "save":
                digest = "no trainer" if trainer is None else weights_digest(trainer)
                say(f"rank {rank}: trained weights sha256 {digest[:16]}")
                digests = [None] * dist.get_world_size()
                dist.all_gather_object(digests, digest)
                if trainer is not None and len(set(digests)) == 1:
                    trainer.save(Path())  # a barrier: rank 0 alone writes
            elif kind == "end":
                trainer = None
        except Exception as exc:
            if collective_error(exc):
                say(f"rank {rank}: a collective failed during {kind!r} ({exc}); exiting")
                return 3
            # the same batch fails the same way on rank 0: its round fails, ours with it
            say(f"rank {rank}: {kind!r} failed ({exc}); waiting for rank 0's next round")
            log.exception("rank %s: %s failed", rank, kind)
            trainer = None
