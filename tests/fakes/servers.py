"""Serve an ASGI app with uvicorn on a free port in a background thread (real HTTP in tests)."""

from __future__ import annotations

import threading
import time
from typing import Self

import uvicorn

from deploy.embedded_redis import free_port


class ServerThread:
    """`with ServerThread(app) as s: httpx.get(s.url + ...)`; stops the server on exit.

    `options` override uvicorn's settings (`log_config=None` leaves logging to setup_logging).
    """

    def __init__(self, app, port: int | None = None, **options) -> None:
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        defaults = {"log_level": "warning", "lifespan": "on", "loop": "asyncio"}
        config = uvicorn.Config(
            app,
            host="127.0.0.1",
            port=self.port,
            timeout_graceful_shutdown=2,
            **(defaults | options),
        )
        self.server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self.server.run, daemon=True)

    def start(self) -> ServerThread:
        self._thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"uvicorn did not start on port {self.port}")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self._thread.join(timeout=10)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
