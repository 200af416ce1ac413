"""Scripted HTTP fixture servers on loopback: the "public" origin and the canaries.

A ``FixtureServer`` listens on one 127.0.0.x address and a random port, counts connections
(``hits``) and requests, and answers each request path with a scripted ``Handler`` that writes
raw bytes, so a test can lie about ``Content-Length``, stream forever, drip, stall or redirect.
Canaries (127.0.0.2-127.0.0.9) answer everything with a valid PNG: a fetch that reaches one would
succeed, so only the policy stands between a vector and a hit.
"""

from __future__ import annotations

import asyncio
import gzip
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

Handler = Callable[[asyncio.StreamWriter], Awaitable[None]]
STREAM_LIMIT = 64 * 1024 * 1024  # an "endless" body still ends here, so no test can run away


def head(status: int = 200, headers: dict[str, str] | None = None) -> bytes:
    lines = [f"HTTP/1.1 {status} X"] + [f"{k}: {v}" for k, v in (headers or {}).items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def body(
    data: bytes, content_type: str | None = None, status: int = 200, extra: dict[str, str] | None = None
) -> Handler:
    async def handler(writer: asyncio.StreamWriter) -> None:
        headers = {"Content-Length": str(len(data)), "Connection": "close", **(extra or {})}
        if content_type:
            headers["Content-Type"] = content_type
        writer.write(head(status, headers) + data)
        await writer.drain()

    return handler


def status(code: int) -> Handler:
    return body(b"nope", "text/plain", status=code)


def redirect(location: str, code: int = 302) -> Handler:
    async def handler(writer: asyncio.StreamWriter) -> None:
        writer.write(head(code, {"Location": location, "Content-Length": "0"}))
        await writer.drain()

    return handler


def stream(headers: dict[str, str], chunk: bytes, *, chunked: bool = False, interval_s: float = 0.0) -> Handler:
    """Headers, then ``chunk`` again and again (chunk-encoded if asked) until the client goes."""

    async def handler(writer: asyncio.StreamWriter) -> None:
        all_headers = {"Transfer-Encoding": "chunked", **headers} if chunked else headers
        writer.write(head(200, all_headers))
        sent = 0
        while sent < STREAM_LIMIT:
            writer.write(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n" if chunked else chunk)
            await writer.drain()
            sent += len(chunk)
            if interval_s:
                await asyncio.sleep(interval_s)

    return handler


def lying_length(declared: int, actual: bytes) -> Handler:
    async def handler(writer: asyncio.StreamWriter) -> None:
        writer.write(head(200, {"Content-Length": str(declared)}) + actual)
        await writer.drain()

    return handler


def gzip_bomb(inflated: int, chunked: bool = False) -> Handler:
    packed = gzip.compress(b"\x00" * inflated, compresslevel=9)
    headers = {"Content-Encoding": "gzip", "Content-Type": "image/png"}
    if chunked:
        return stream(headers, packed, chunked=True)
    return body(packed, extra=headers)


def stall(arrived: asyncio.Event | None = None) -> Handler:
    """Never answer; ``arrived`` is set once a request reached the server."""

    async def handler(writer: asyncio.StreamWriter) -> None:
        if arrived is not None:
            arrived.set()
        await asyncio.sleep(3600)

    return handler


def sequence(*handlers: Handler) -> Handler:
    """The first request gets ``handlers[0]``, the next ``handlers[1]``...; the last one repeats."""
    calls = {"n": 0}

    async def handler(writer: asyncio.StreamWriter) -> None:
        index = min(calls["n"], len(handlers) - 1)
        calls["n"] += 1
        await handlers[index](writer)

    return handler


@dataclass
class FixtureServer:
    host: str
    routes: dict[str, Handler] = field(default_factory=dict)
    fallback: Handler | None = None
    tls: ssl.SSLContext | None = None
    port: int = 0
    hits: int = 0  # connections accepted
    requests: list[tuple[str, dict[str, str]]] = field(default_factory=list)  # (target, headers)
    _server: asyncio.Server | None = None
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)

    async def start(self) -> FixtureServer:
        self._server = await asyncio.start_server(self._on_connect, self.host, 0, ssl=self.tls)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def paths(self) -> list[str]:
        return [target for target, _ in self.requests]

    async def _on_connect(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.hits += 1
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            raw = await reader.readuntil(b"\r\n\r\n")
            line, *lines = raw.decode("latin-1").split("\r\n")
            target = line.split(" ")[1]
            headers = {k.strip().lower(): v.strip() for k, _, v in (x.partition(":") for x in lines if x)}
            self.requests.append((target, headers))
            handler = self.routes.get(target.split("?", 1)[0], self.fallback or status(404))
            await handler(writer)
        except (ConnectionError, asyncio.IncompleteReadError, ssl.SSLError):
            pass  # the fetcher hung up on purpose (cap reached, refused answer): expected here
        except asyncio.CancelledError:
            # close() cancels handlers still stalling; end normally, because asyncio (3.11) logs
            # a cancelled connection task as an error.
            return
        finally:
            writer.close()
            self._tasks.discard(task)


async def start_canaries(payload: bytes) -> dict[str, FixtureServer]:
    """Canary servers on 127.0.0.2-127.0.0.9, each answering any path with ``payload`` (a PNG)."""
    canaries = {}
    for last in range(2, 10):
        host = f"127.0.0.{last}"
        canaries[host] = await FixtureServer(host, fallback=body(payload, "image/png")).start()
    return canaries
