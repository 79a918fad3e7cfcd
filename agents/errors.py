"""One error vocabulary: a failure that has an answer (an HTTP status, a reason, when to retry).

Each process has one handler that turns an `ArloopError` into its response: the agent API as
`{"detail": reason}`, the policy server in OpenAI's `{"error": {...}}` shape.
"""

from __future__ import annotations


class ArloopError(Exception):
    """A failure with an answer: `status` (HTTP), `reason` (what was wrong and what to do),
    `retry_after` (seconds, when trying again later will help)."""

    def __init__(self, status: int, reason: str, retry_after: int | None = None) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason
        self.retry_after = retry_after

    def headers(self) -> dict[str, str]:
        """The response headers this answer carries: `Retry-After` when `retry_after` is set."""
        return {} if self.retry_after is None else {"Retry-After": str(self.retry_after)}
