"""HTTP limits enforced below the ASGI app, where uvicorn offers none.

Owns: ``LimitedHttpToolsProtocol``, uvicorn's httptools protocol with the ``HttpLimits`` of
``FrontendSettings``, and ``limited_protocol``, the class for one server's limits. It adds:

* a header deadline: a connection must deliver a request's line and headers within
  ``header_timeout_s`` of opening (or of its previous response's end), else a 408 and the close;
  this is what ends slowloris connections that send part of their headers or nothing;
* a header size and count limit: more than ``max_header_bytes`` of request line and headers, or
  more than ``max_headers`` fields, is a 431 at once, before the parser buffers any more;
* a connection cap: once ``max_connections`` are open, a new request gets a 503 with
  ``Retry-After`` and its connection is closed, before it reaches the app;
* the error envelope for every answer of the protocol itself, the parser's own 400 included
  (uvicorn's is plain text), and one log line of ours for each (uvicorn would also log "Invalid
  HTTP request received." at warning for every refusal raised from a parser callback).

Each of these answers is written on the transport directly (no ASGI app runs), then the server
half-closes and reads and discards what the client still sends for up to ``LINGER_S``: closing at
once, with unread data, would reset the connection and the client would never read the answer. The body's deadline needs the app's reads and lives in ``body_limit``.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any, ClassVar

import httptools
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from openai_frontend.http.errors import RETRY_AFTER_S
from openai_frontend.settings import HttpLimits
from python_backend.protocol.errors import (
    ErrorInfo,
    headers_too_large,
    invalid_http_request,
    request_timeout,
    too_many_connections,
)

logger = logging.getLogger(__name__)

LINGER_S = 2.0  # how long a refused connection's remaining input is read and dropped
_REASONS = {
    400: "Bad Request",
    408: "Request Timeout",
    431: "Request Header Fields Too Large",
    503: "Service Unavailable",
}


class _Refused(Exception):
    """Raised inside a parser callback to stop parsing; the parser reports it as its own error."""


def raw_error_response(info: ErrorInfo) -> bytes:
    """A complete HTTP/1.1 response carrying ``info`` in the envelope, closing the connection."""
    body = json.dumps(
        {"error": {"message": info.message, "type": info.type, "param": info.param, "code": info.code}}
    ).encode("utf-8")
    lines = [
        f"HTTP/1.1 {info.status} {_REASONS.get(info.status, 'Error')}",
        "content-type: application/json",
        f"content-length: {len(body)}",
        "connection: close",
    ]
    if info.status == 503:
        lines.append(f"retry-after: {RETRY_AFTER_S}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("ascii") + body


class LimitedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with the limits of ``limits`` (a subclass per server sets it)."""

    limits: ClassVar[HttpLimits] = HttpLimits()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._header_timer: asyncio.TimerHandle | None = None
        self._in_headers = True  # the next bytes belong to a request line or headers
        self._raw_header_bytes = 0  # bytes received while in headers (a lower bound of their size)
        self._header_bytes = 0  # the request line and fields the parser reported
        self._header_fields = 0
        self._refused: ErrorInfo | None = None
        self._linger: asyncio.TimerHandle | None = None  # set once answered: input is dropped

    # --- the header deadline ------------------------------------------------------------------
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._start_header_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_header_timer()
        if self._linger is not None:
            self._linger.cancel()
        super().connection_lost(exc)

    def on_response_complete(self) -> None:
        super().on_response_complete()
        # Unless a pipelined request (headers already in) took over, the next request's clock starts.
        if not self.transport.is_closing() and (self.cycle is None or self.cycle.response_complete):
            self._start_header_timer()

    def _start_header_timer(self) -> None:
        self._stop_header_timer()
        self._header_timer = self.loop.call_later(self.limits.header_timeout_s, self._headers_timed_out)

    def _stop_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _headers_timed_out(self) -> None:
        self._header_timer = None
        if self.cycle is not None and not self.cycle.response_complete:
            return  # a request is being answered: its headers did arrive
        self._answer(request_timeout(self.limits.header_timeout_s, "headers"))

    # --- header size and count ----------------------------------------------------------------
    def data_received(self, data: bytes) -> None:
        if self._linger is not None:
            return  # answered: what still comes is dropped
        if self._in_headers:
            self._raw_header_bytes += len(data)
        self._feed(data)
        # Still in the headers after this chunk: every byte counted so far is header bytes.
        if self._in_headers and self._raw_header_bytes > self.limits.max_header_bytes:
            self._answer(headers_too_large(f"more than {self.limits.max_header_bytes} bytes"))

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._header_bytes = 0
        self._header_fields = 0

    def on_url(self, url: bytes) -> None:
        super().on_url(url)
        self._count_header_bytes(len(url))

    def on_header(self, name: bytes, value: bytes) -> None:
        self._header_fields += 1
        if self._header_fields > self.limits.max_headers:
            self._refuse(headers_too_large(f"more than {self.limits.max_headers} header fields"))
        self._count_header_bytes(len(name) + len(value) + 4)  # ": " and CRLF
        super().on_header(name, value)

    def _count_header_bytes(self, size: int) -> None:
        self._header_bytes += size
        if self._header_bytes > self.limits.max_header_bytes:
            self._refuse(headers_too_large(f"more than {self.limits.max_header_bytes} bytes"))

    def on_headers_complete(self) -> None:
        self._stop_header_timer()
        self._in_headers = False
        if len(self.connections) > self.limits.max_connections:
            self._refuse(too_many_connections(self.limits.max_connections))
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._in_headers = True
        self._raw_header_bytes = 0

    def _feed(self, data: bytes) -> None:
        """uvicorn's ``data_received`` without its warning on a parser error: a refusal raised from
        a callback is a parser error too, and ``_answer`` logs what it was."""
        self._unset_keepalive_if_required()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            self._answer(self._refused or invalid_http_request())
        except httptools.HttpParserUpgrade:
            if self._should_upgrade():
                self.handle_websocket_upgrade()
            else:
                self._unsupported_upgrade_warning()

    # --- answers of the protocol itself -------------------------------------------------------
    def _refuse(self, info: ErrorInfo) -> None:
        """Stop the parser from a callback; ``send_400_response`` then answers ``info``."""
        self._refused = info
        raise _Refused(info.message)

    def send_400_response(self, msg: str) -> None:
        # Kept for any other path of uvicorn's that answers a parser error itself.
        self._answer(self._refused or invalid_http_request())

    def eof_received(self) -> None:
        if self._linger is not None:
            self.transport.close()  # the client is done too

    def _answer(self, info: ErrorInfo) -> None:
        self._stop_header_timer()
        if self.transport.is_closing() or self._linger is not None:
            return
        # The server's own limit (the connection cap) is the operator's concern; the rest are the
        # client's mistakes, and a client can send them at any rate.
        level = logging.WARNING if info.status >= 500 else logging.INFO
        logger.log(level, "HTTP %d to %s: %s", info.status, _peer(self.client), info.message)
        self.transport.write(raw_error_response(info))
        self._linger = self.loop.call_later(LINGER_S, self.transport.close)
        if self.transport.can_write_eof():
            self.transport.write_eof()
        else:  # TLS cannot half-close
            self.transport.close()


def _peer(client: tuple[str, int] | None) -> str:
    return "an unknown client" if client is None else f"{client[0]}:{client[1]}"


def limited_protocol(limits: HttpLimits) -> type[LimitedHttpToolsProtocol]:
    """The protocol class for uvicorn's ``http`` option, enforcing ``limits``."""
    return type("LimitedHttpToolsProtocol", (LimitedHttpToolsProtocol,), {"limits": limits})
