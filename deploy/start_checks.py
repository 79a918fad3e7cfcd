"""What a serving process checks before it starts anything (Redis, a model, a socket): each
check that fails is one line naming the fix, and all of them are reported at once
(`StartRefused`, printed by the CLI's error boundary, exit 2)."""

from __future__ import annotations

import errno
import socket
from collections.abc import Callable


class StartRefused(Exception):
    """A process cannot start; `problems`: one line each, with its fix."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


def refuse(*checks: Callable[[], object], errors: tuple[type[Exception], ...]) -> None:
    """Run every check; StartRefused with the message of each that raised one of `errors`."""
    problems = []
    for check in checks:
        try:
            check()
        except StartRefused as exc:
            problems.extend(exc.problems)
        except errors as exc:
            problems.append(str(exc))
    if problems:
        raise StartRefused(problems)


def port_free(host: str, port: int, process: str, flag: str) -> None:
    """StartRefused naming `flag` and ARLOOP_<PROCESS>_PORT when `host:port` cannot be bound
    (in use, or not an address of this machine); port 0 (any free one) always passes."""
    if port == 0:
        return
    family = socket.AF_INET6 if ":" in host.strip("[]") else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
        try:
            probe.bind((host.strip("[]"), port))
        except OSError as exc:
            raise StartRefused([_why(exc, host, port, process, flag)]) from None


def _why(exc: OSError, host: str, port: int, process: str, flag: str) -> str:
    setting = f"ARLOOP_{process}_PORT"
    if exc.errno == errno.EADDRINUSE:
        return (
            f"port {port} on {host} is already in use (another arloop, or another server): "
            f"choose another with {flag} {port + 1} or {setting}={port + 1}, or stop what "
            f"holds it (`ss -ltnp 'sport = :{port}'`)"
        )
    if exc.errno == errno.EACCES:
        return f"port {port} needs root: choose one above 1023 with {flag} or {setting}"
    return (
        f"cannot listen on {host}:{port} ({exc.strerror}): set ARLOOP_{process}_HOST to an "
        f"address of this machine (127.0.0.1, 0.0.0.0) or choose another {flag}"
    )
