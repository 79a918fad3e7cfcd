"""Capture what `setup_logging` writes, and put the test process's logging back afterwards."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager

from deploy.logs import CHATTY_LOGGERS, UVICORN_LOGGERS, LogFormat, setup_logging


class Captured:
    """The lines a process wrote; `records()` parses each as JSON (failing on any that is not)."""

    def __init__(self, stream: io.StringIO) -> None:
        self.stream = stream

    def text(self) -> str:
        return self.stream.getvalue()

    def records(self) -> list[dict]:
        return [json.loads(line) for line in self.text().splitlines()]


@contextmanager
def captured_logs(process: str, fmt: LogFormat = "json") -> Iterator[Captured]:
    """`setup_logging(process)` onto a buffer; the loggers it touches restored on exit."""
    names = ("", *UVICORN_LOGGERS, *CHATTY_LOGGERS)
    saved = {n: (lg.handlers[:], lg.level, lg.propagate) for n in names if (lg := _get(n))}
    stream = io.StringIO()
    try:
        setup_logging(process, "INFO", fmt, stream=stream)
        yield Captured(stream)
    finally:
        for name, (handlers, level, propagate) in saved.items():
            logger = _get(name)
            logger.handlers[:] = handlers
            logger.setLevel(level)
            logger.propagate = propagate


def _get(name: str) -> logging.Logger:
    return logging.getLogger(name or None)
