"""API-key authentication, deny by default.

Owns: ``ApiKeyMiddleware``, a pure ASGI middleware installed when keys are configured. Every
request needs ``Authorization: Bearer <key>`` except the exact probe paths in ``PUBLIC_PATHS``.
The check reads the raw ``scope["path"]`` (never a URL rebuilt from the ``Host`` header, the
CVE-2026-48746 lesson), so a route added later is protected without being listed anywhere, and
keys are compared with ``hmac.compare_digest`` against every configured key. A request with more
than one ``Authorization`` header is a 400: proxies and servers disagree on which one counts.
"""

from __future__ import annotations

import hmac
from collections.abc import Sequence

from starlette.types import ASGIApp, Receive, Scope, Send

from openai_frontend.http.errors import error_response
from python_backend.protocol.errors import duplicate_header, unauthorized

PUBLIC_PATHS = frozenset({"/health", "/health/ready"})  # liveness/readiness probes carry no key


def authorization_headers(scope: Scope) -> list[bytes]:
    """The values of every ``Authorization`` header, in order."""
    return [value for name, value in scope.get("headers", []) if name == b"authorization"]


def bearer_token(scope: Scope) -> bytes | None:
    """The token of the first ``Authorization`` header, if it uses the Bearer scheme."""
    for value in authorization_headers(scope):
        scheme, _, token = value.partition(b" ")
        return token.strip() if scheme.lower() == b"bearer" else None
    return None


def key_matches(token: bytes, keys: Sequence[bytes]) -> bool:
    """Constant-time comparison against every key (no early exit on a match)."""
    matched = False
    for key in keys:
        matched |= hmac.compare_digest(token, key)
    return matched


class ApiKeyMiddleware:
    """Rejects requests without a valid key with the 401 envelope."""

    def __init__(self, app: ASGIApp, keys: Sequence[str]) -> None:
        self.app = app
        self._keys = tuple(key.encode("utf-8") for key in keys)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket") or scope["path"] in PUBLIC_PATHS:
            await self.app(scope, receive, send)
            return
        if len(authorization_headers(scope)) > 1:
            if scope["type"] == "websocket":
                await send({"type": "websocket.close", "code": 1008})
                return
            await error_response(duplicate_header("Authorization"))(scope, receive, send)
            return
        token = bearer_token(scope)
        if token is not None and key_matches(token, self._keys):
            await self.app(scope, receive, send)
            return
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})
            return
        response = error_response(unauthorized(), headers={"WWW-Authenticate": "Bearer"})
        await response(scope, receive, send)
