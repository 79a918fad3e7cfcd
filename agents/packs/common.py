"""What the packs share: the PHI scrubber their agents run on user input."""

from __future__ import annotations

import threading
from typing import Any

_lock = threading.Lock()
_built: list[Any] = []


def _scrubber() -> Any:
    with _lock:  # runs get here from several threads at once: build it once
        if not _built:
            from agents.pii import PhiScrubber  # presidio: built on the first input (~1 s)

            _built.append(PhiScrubber())
    return _built[0]


def scrub_input(text: str) -> str:
    """The user's message with PHI/PII replaced by placeholders (`[NAME]`, `[PHONE]`, ...)."""
    return _scrubber().scrub(text)
