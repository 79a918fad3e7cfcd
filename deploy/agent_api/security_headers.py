"""The security headers of every agent API response: one ASGI middleware, outermost.

The pages keep an API key in the browser and show medical conversations, so:
- a Content-Security-Policy that lets a page load scripts, styles, images and fetches from
  this origin only: no inline script or style, no eval, no plugins, no `<base>`, forms to this
  origin only; Trusted Types, so the one place a page writes markup (the dashboard's SVG
  charts, made by the server from numbers) goes through one named policy and any other
  markup written from a string is refused;
- framing refused (`frame-ancestors 'none'` and `X-Frame-Options: DENY`): a framed chat page
  works with the key the browser stored, and another site could click through it;
- no MIME sniffing, no Referer, the window and the resources kept from other origins (COOP,
  CORP), browser features the pages never use turned off;
- HSTS on HTTPS.

API answers (`/v1/...`, JSON and event streams) get the short set an API sends: framing,
sniffing, Referer and other origins refused, a CSP that lets nothing load (`default-src
'none'`) and `Cache-Control: no-store`, since they carry medical conversations. Each set is
prepared once: the middleware adds a few byte pairs to each response and reads nothing, so the
feedback fast path (`ingest.py`) stays as fast. A header a route set itself is kept.

FastAPI's `/docs` and `/redoc` load Swagger UI and ReDoc from a CDN with an inline bootstrap:
they get every header but the script policy (their CSP is `frame-ancestors` only).
"""

from __future__ import annotations

from collections.abc import Iterable

# The dashboard's policy name for its server-made SVG (static/dashboard.js).
SVG_POLICY = "arloop-svg"
PAGE_CSP = "; ".join(
    [
        "default-src 'none'",
        "script-src 'self'",
        "style-src 'self'",
        "img-src 'self'",
        "connect-src 'self'",
        "base-uri 'none'",
        "form-action 'self'",
        "frame-ancestors 'none'",
        "require-trusted-types-for 'script'",
        f"trusted-types {SVG_POLICY}",
    ]
)
API_CSP = "default-src 'none'; frame-ancestors 'none'"  # JSON: a document that loads nothing
DOCS_CSP = "frame-ancestors 'none'"
PERMISSIONS = "accelerometer=(), camera=(), geolocation=(), gyroscope=(), magnetometer=(), "
PERMISSIONS += "microphone=(), payment=(), usb=()"
BASE = {
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cross-Origin-Resource-Policy": "same-origin",
}
DOCUMENT = BASE | {"Cross-Origin-Opener-Policy": "same-origin", "Permissions-Policy": PERMISSIONS}
HSTS = "max-age=31536000"


def _encoded(headers: dict[str, str]) -> list[tuple[bytes, bytes]]:
    return [(name.lower().encode(), value.encode()) for name, value in headers.items()]


PAGE = _encoded(DOCUMENT | {"Content-Security-Policy": PAGE_CSP})
API = _encoded(BASE | {"Content-Security-Policy": API_CSP, "Cache-Control": "no-store"})
DOCS = _encoded(DOCUMENT | {"Content-Security-Policy": DOCS_CSP})
TLS = _encoded({"Strict-Transport-Security": HSTS})


class SecurityHeaders:
    """ASGI middleware: the headers above on every HTTP response; `docs` are the paths of the
    framework's documentation pages (the app's `docs_url`, `redoc_url`, ...)."""

    def __init__(self, app, docs: Iterable[str | None] = ()) -> None:
        self.app, self.docs = app, frozenset(p for p in docs if p)

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = scope["path"]
        extra = DOCS if path in self.docs else API if path.startswith("/v1/") else PAGE
        if scope.get("scheme") == "https":
            extra = extra + TLS

        async def send_secured(message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": with_defaults(message.get("headers", ()), extra)}
            await send(message)

        return await self.app(scope, receive, send_secured)


def with_defaults(headers, defaults: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """`headers` and each of `defaults` whose name they do not already have."""
    have = {name.lower() for name, _ in headers}
    return [*headers, *(pair for pair in defaults if pair[0] not in have)]
