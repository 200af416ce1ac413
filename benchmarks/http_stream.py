"""A lean HTTP/1.1 client for streaming POSTs: one keep-alive connection, SSE lines as they come.

The load generator shares the machine with the server it measures (2 cores here), so every
microsecond it spends per token is taken from the server. httpx spent about 220 us of CPU per
streamed token (h11 parsing, decoders, async iterators); this client reads the socket directly
and costs a fraction of that, for every server alike. It speaks just what the benchmark needs:
a POST with a JSON body, a response with Content-Length, chunked transfer coding or close-
delimited, over TCP or TLS.
"""

from __future__ import annotations

import asyncio
import json
import logging
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from urllib.parse import urlsplit

logger = logging.getLogger(__name__)


class HttpError(Exception):
    """The server answered with a status other than 200; the message has the start of its body."""


@dataclass
class StreamingConnection:
    """One keep-alive connection to the host of ``url``; requests on it run one at a time."""

    url: str
    headers: dict[str, str] = field(default_factory=dict)
    _reader: asyncio.StreamReader | None = None
    _writer: asyncio.StreamWriter | None = None

    async def _connect(self) -> None:
        parts = urlsplit(self.url)
        secure = parts.scheme == "https"
        port = parts.port or (443 if secure else 80)
        self._reader, self._writer = await asyncio.open_connection(
            parts.hostname, port, ssl=ssl.create_default_context() if secure else None
        )

    async def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            try:
                await self._writer.wait_closed()
            except OSError as exc:  # the peer may already have gone; closing is all we wanted
                logger.debug("closing the connection to %s: %s", self.url, exc)
        self._reader = self._writer = None

    async def post_lines(self, body: dict[str, object]) -> AsyncIterator[bytes]:
        """POST ``body`` as JSON; yield the response body's lines (without line ends)."""
        parts = urlsplit(self.url)
        payload = json.dumps(body).encode()
        head = [
            f"POST {parts.path or '/'}{'?' + parts.query if parts.query else ''} HTTP/1.1",
            f"Host: {parts.netloc}",
            "Content-Type: application/json",
            "Accept: text/event-stream",
            f"Content-Length: {len(payload)}",
            *(f"{k}: {v}" for k, v in self.headers.items()),
        ]
        reader, status_line = await self._send(("\r\n".join(head) + "\r\n\r\n").encode() + payload)
        status = int(status_line.split()[1])
        length, chunked, close = None, False, False
        while (line := await reader.readline()) not in (b"\r\n", b"\n", b""):
            name, _, value = line.decode("latin-1").partition(":")
            name, value = name.strip().lower(), value.strip().lower()
            if name == "content-length":
                length = int(value)
            elif name == "transfer-encoding" and "chunked" in value:
                chunked = True
            elif name == "connection" and value == "close":
                close = True
        if status != 200:
            text = b"".join([part async for part in self._body(reader, length, chunked)])
            await self.close()
            raise HttpError(f"HTTP {status}: {text[:200].decode(errors='replace')}")
        pending = b""
        async for part in self._body(reader, length, chunked):
            pending += part
            *lines, pending = pending.split(b"\n")
            for line in lines:
                yield line.rstrip(b"\r")
        if pending:
            yield pending.rstrip(b"\r")
        if close or (length is None and not chunked):
            await self.close()

    async def _send(self, request: bytes) -> tuple[asyncio.StreamReader, bytes]:
        """Send ``request``; the reader and the response's status line. A kept-alive connection that
        the server closed after its last response (llama-server does after each stream, without a
        ``Connection: close``) is opened anew and the request sent once more: it was never read."""
        reused = self._writer is not None
        if not reused:
            await self._connect()
        reader, writer = self._reader, self._writer
        if reader is None or writer is None:
            raise ConnectionError("not connected")
        try:
            writer.write(request)
            await writer.drain()
            status_line = await reader.readline()
        except ConnectionError:
            status_line = b""
            if not reused:
                raise
        if status_line:
            return reader, status_line
        await self.close()
        if reused:
            return await self._send(request)
        raise ConnectionError("the server closed the connection")

    @staticmethod
    async def _body(reader: asyncio.StreamReader, length: int | None, chunked: bool) -> AsyncIterator[bytes]:
        if chunked:
            while True:
                size = int((await reader.readline()).split(b";")[0], 16)
                if size == 0:
                    while (await reader.readline()) not in (b"\r\n", b"\n", b""):
                        pass  # trailer fields: none expected, read past them
                    return
                yield await reader.readexactly(size)
                await reader.readexactly(2)  # the CRLF after each chunk
        elif length is not None:
            if length:
                yield await reader.readexactly(length)
        else:
            while part := await reader.read(65536):
                yield part
