"""Admission control: the engine holds at most its batch of rows; other requests wait in a queue
bounded in tokens and in time; a request beyond either bound, or one that arrives while the
server shuts down, is a 503 with Retry-After and a reason, never an unbounded wait.

A request costs its rows (`n`) in the engine and, while it waits, its tokens in the queue
(`n` x `max_tokens` plus its prompt's tokens: what it may make the engine hold). Requests are
admitted in arrival order (a large one at the head is not overtaken: nothing starves). On
shutdown the queue is refused at once and the requests generating get a grace period; past
it each is told (`on_expire`) and answers 503 itself. Everything here runs on the event loop.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum

from deploy.policy_server.metrics import PolicyMetrics
from deploy.policy_server.openai_wire import OpenAIError

log = logging.getLogger(__name__)


class Refusal(StrEnum):
    """Why a request got a 503: the `code` of its error."""

    QUEUE_FULL = "queue_full"
    QUEUE_TIMEOUT = "queue_timeout"
    SHUTTING_DOWN = "shutting_down"


class TicketState(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    DONE = "done"


@dataclass(eq=False)
class Ticket:
    """One request's place: queued, then running in the engine, then done."""

    rows: int
    tokens: int
    admitted: asyncio.Future
    state: TicketState = TicketState.QUEUED
    held: int = 0  # rows still in the engine while running
    on_expire: Callable[[], None] | None = None
    """Called when shutdown's grace runs out while the request generates."""


class Admission:
    """The engine's rows in use, the queue before it, and the shutdown state."""

    def __init__(
        self,
        *,
        slots: int,
        queue_tokens: int,
        queue_wait_s: float,
        grace_s: float,
        metrics: PolicyMetrics,
    ) -> None:
        self.slots, self.queue_tokens, self.queue_wait_s = slots, queue_tokens, queue_wait_s
        self.grace_s, self.metrics = grace_s, metrics
        self.closing = False
        self._queue: deque[Ticket] = deque()
        self._queued_tokens = 0
        self._running: set[Ticket] = set()
        self._running_rows = 0

    def state(self) -> dict[str, int | bool]:
        """What `/healthz` reports: rows generating, requests and tokens queued, shutting down."""
        return {
            "running_rows": self._running_rows,
            "queued": len(self._queue),
            "queued_tokens": self._queued_tokens,
            "shutting_down": self.closing,
        }

    async def enter(self, rows: int, tokens: int) -> Ticket:
        """Wait for room in the engine; a 503 when the queue is full, the wait is over its
        bound or the server shuts down. Cancelled (the client left): its place is freed."""
        if self.closing:
            raise self._refuse(Refusal.SHUTTING_DOWN)
        ticket = Ticket(rows, tokens, asyncio.get_running_loop().create_future())
        if not self._queue and self._fits(rows):
            self._start(ticket)
            return ticket
        if self._queued_tokens + tokens > self.queue_tokens:
            raise self._refuse(Refusal.QUEUE_FULL, tokens)
        self._queue.append(ticket)
        self._queued_tokens += tokens
        self._gauges()
        try:
            async with asyncio.timeout(self.queue_wait_s):
                await asyncio.shield(ticket.admitted)
        except TimeoutError:
            if ticket.state is TicketState.RUNNING:  # admitted as the bound ran out
                return ticket
            self._unqueue(ticket)
            raise self._refuse(Refusal.QUEUE_TIMEOUT) from None
        except asyncio.CancelledError:
            self.leave(ticket)
            raise
        return ticket  # or the shutdown's refusal, raised by the await above

    def row_done(self, ticket: Ticket) -> None:
        """One of the request's rows left the engine: its slot is free, though the answer may
        still be on its way to a slow reader."""
        if ticket.state is TicketState.RUNNING and ticket.held > 0:
            ticket.held -= 1
            self._running_rows -= 1
            self._admit_next()
            self._gauges()

    def leave(self, ticket: Ticket) -> None:
        """The request is done (answered, failed, or its client left): free its place."""
        if ticket.state is TicketState.QUEUED:
            self._unqueue(ticket)
        elif ticket.state is TicketState.RUNNING:
            ticket.state = TicketState.DONE
            self._running.discard(ticket)
            self._running_rows -= ticket.held
            ticket.held = 0
            self._admit_next()
        self._gauges()

    def close(self) -> None:
        """Shutdown: refuse new requests and the queued ones now; the running ones are told
        when `grace_s` has passed (their `on_expire`)."""
        if self.closing:
            return
        self.closing = True
        refused = len(self._queue)
        while self._queue:
            ticket = self._queue.popleft()
            ticket.state = TicketState.DONE
            if not ticket.admitted.done():
                ticket.admitted.set_exception(self._refuse(Refusal.SHUTTING_DOWN))
        self._queued_tokens = 0
        self._gauges()
        log.info(
            "shutting down: %d queued requests refused, %d generating get %.0f s",
            refused,
            len(self._running),
            self.grace_s,
        )
        asyncio.get_running_loop().call_later(self.grace_s, self._expire)

    def _expire(self) -> None:
        for ticket in list(self._running):
            if ticket.on_expire is not None:
                ticket.on_expire()

    def shutdown_error(self) -> OpenAIError:
        """What a request cut off by shutdown answers."""
        return self._refuse(Refusal.SHUTTING_DOWN, count=False)

    def _fits(self, rows: int) -> bool:
        """Room for `rows` more: within the batch, or alone (a request with `n` above it)."""
        return self._running_rows == 0 or self._running_rows + rows <= self.slots

    def _start(self, ticket: Ticket) -> None:
        ticket.state, ticket.held = TicketState.RUNNING, ticket.rows
        self._running.add(ticket)
        self._running_rows += ticket.rows
        if not ticket.admitted.done():
            ticket.admitted.set_result(None)
        self._gauges()

    def _unqueue(self, ticket: Ticket) -> None:
        if ticket.state is not TicketState.QUEUED:
            return
        ticket.state = TicketState.DONE
        self._queue.remove(ticket)
        self._queued_tokens -= ticket.tokens
        self._admit_next()  # it may have been the head that held the others back

    def _admit_next(self) -> None:
        while self._queue and not self.closing and self._fits(self._queue[0].rows):
            ticket = self._queue.popleft()
            self._queued_tokens -= ticket.tokens
            self._start(ticket)

    def _gauges(self) -> None:
        self.metrics.running_rows.set(self._running_rows)
        self.metrics.queued_tokens.set(self._queued_tokens)

    def _refuse(self, why: Refusal, tokens: int = 0, count: bool = True) -> OpenAIError:
        if count:
            self.metrics.refused.labels(reason=why.value).inc()
        if why is Refusal.QUEUE_FULL:
            message = (
                f"the policy server is busy: {self._queued_tokens} tokens are queued and this "
                f"request's {tokens} (n x max_tokens plus the prompt) would pass "
                f"ARLOOP_POLICY_QUEUE_TOKENS ({self.queue_tokens}); retry later, or ask for "
                "fewer tokens"
            )
            retry = self.queue_wait_s
        elif why is Refusal.QUEUE_TIMEOUT:
            message = (
                f"the policy server is busy: this request waited {self.queue_wait_s:g} s "
                "(ARLOOP_POLICY_QUEUE_WAIT_S) without a free slot; retry later"
            )
            retry = self.queue_wait_s
        else:
            message = "the policy server is shutting down; retry (another replica answers)"
            retry = 1
        error = OpenAIError(503, message, code=why.value)
        error.retry_after = max(1, math.ceil(retry))
        return error
