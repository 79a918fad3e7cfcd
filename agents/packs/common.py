"""What the packs share: the PHI scrubber their agents run on user input."""

from __future__ import annotations


def scrub_input(text: str) -> str:
    """The user's message with PHI/PII replaced by placeholders (`[NAME]`, `[PHONE]`, ...)."""
    from agents.pii import shared_scrubber  # presidio: loaded on the first input, not on import

    return shared_scrubber().scrub(text)
