"""One logging setup for every arloop process: `setup_logging(process, level)`, once, at start.

Lines are JSON on stderr (python-json-logger): `timestamp`, `level`, `logger`, `message`,
`process`, and, when the code handling the work has bound them, `trace` (the trajectory,
thread or request id) and `version` (the policy version). uvicorn's access and error lines go
through the same handler. `text` is the same lines for people reading a terminal.

Never log user text (inputs, answers, feedback text): it is PHI until the trajectory sink has
scrubbed it, and logs are not scrubbed.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import IO, Literal

from pythonjsonlogger.core import RESERVED_ATTRS
from pythonjsonlogger.json import JsonFormatter

LogFormat = Literal["json", "text"]
UVICORN_LOGGERS = ("uvicorn", "uvicorn.error", "uvicorn.access")
# INFO there is noise: a line per litellm completion, one per presidio recognizer at start.
CHATTY_LOGGERS = ("LiteLLM", "LiteLLM Router", "LiteLLM Proxy", "presidio-analyzer", "httpx")
# Record attributes that are not fields: uvicorn's ANSI copy of the message, litellm's mark on
# a record it has scrubbed of secrets.
_NOT_FIELDS = ("color_message", "litellm_redacted")

_trace: ContextVar[str | None] = ContextVar("arloop_log_trace", default=None)
_version: ContextVar[str | None] = ContextVar("arloop_log_version", default=None)


def bind(*, trace: str | None = None, version: str | None = None) -> None:
    """Tag the lines this task logs from now on; a request is one task, its access line included."""
    if trace is not None:
        _trace.set(trace)
    if version is not None:
        _version.set(version)


@contextmanager
def log_context(*, trace: str | None = None, version: str | None = None) -> Iterator[None]:
    """Tag the lines logged inside the block (work outside a request: the learner's gate)."""
    tokens = [
        (var, var.set(value)) for var, value in ((_trace, trace), (_version, version)) if value
    ]
    try:
        yield
    finally:
        for var, token in reversed(tokens):
            var.reset(token)


class _Context(logging.Filter):
    """Adds the bound `trace` and `version` to each record that passes the handler."""

    def filter(self, record: logging.LogRecord) -> bool:
        trace, version = _trace.get(), _version.get()
        if trace is not None:
            record.trace = trace
        if version is not None:
            record.version = version
        return True


def setup_logging(
    process: str, level: str = "INFO", fmt: LogFormat = "json", stream: IO[str] | None = None
) -> logging.Handler:
    """Route every logger (uvicorn's too) to one handler on `stream` (stderr); returns it.

    Replaces the root logger's handlers, so calling it again reconfigures rather than doubles.
    """
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.addFilter(_Context())
    handler.setFormatter(_json(process) if fmt == "json" else _text(process))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    for name in UVICORN_LOGGERS:  # start uvicorn with log_config=None, or it installs its own
        uvicorn_logger = logging.getLogger(name)
        uvicorn_logger.handlers.clear()
        uvicorn_logger.propagate = True
    for name in CHATTY_LOGGERS:
        logging.getLogger(name).setLevel(max(logging.WARNING, root.level))
    return handler


def _json(process: str) -> logging.Formatter:
    return JsonFormatter(
        "{levelname}{name}{message}",
        style="{",
        rename_fields={"levelname": "level", "name": "logger"},
        static_fields={"process": process},  # the record's own `process` (the pid) is skipped
        reserved_attrs=[*RESERVED_ATTRS, *_NOT_FIELDS],
        timestamp=True,
    )


def _text(process: str) -> logging.Formatter:
    return logging.Formatter(f"%(asctime)s %(levelname)s {process} %(name)s: %(message)s")
