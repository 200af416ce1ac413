"""The network seam of the media fetcher: how names are resolved and addresses dialed.

Owns: the ``Resolver``, ``Dialer`` and ``Connection`` protocols, ``Network`` (the pair the fetcher
uses, plus the TLS context), and the production implementations: ``system_resolve`` (the OS
resolver, once per call) and ``open_tcp`` (an asyncio connection to one *address*, with the TLS
server name and certificate check on the original host name).

Why a seam: the fetcher must dial exactly the address it checked (DNS rebinding), so the dialer
takes an IP, never a name; and tests replace both halves (a dnslib resolver, a dialer that maps the
one test "public" address to a loopback fixture and refuses everything else), so no test traffic
ever leaves 127.0.0.0/8.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
from collections.abc import Sequence
from dataclasses import dataclass, field
from ipaddress import ip_address
from typing import Protocol

from openai_frontend.media.addresses import IPAddress

READ_CHUNK = 64 * 1024  # one socket read; the overshoot past a size cap is below this


class Connection(Protocol):
    async def read(self, max_bytes: int) -> bytes:
        """Up to ``max_bytes``; ``b""`` at end of stream."""
        ...

    async def write(self, data: bytes) -> None: ...

    def close(self) -> None: ...


class Resolver(Protocol):
    async def __call__(self, host: str) -> Sequence[IPAddress]:
        """Every address ``host`` resolves to (may raise ``OSError``)."""
        ...


class Dialer(Protocol):
    async def __call__(self, ip: IPAddress, port: int, *, tls: ssl.SSLContext | None, server_name: str) -> Connection:
        """A connection to ``ip``:``port``; with ``tls``, a TLS session for ``server_name``."""
        ...


class StreamConnection:
    """``Connection`` over asyncio streams."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer

    async def read(self, max_bytes: int) -> bytes:
        return await self._reader.read(max_bytes)

    async def write(self, data: bytes) -> None:
        self._writer.write(data)
        await self._writer.drain()

    def close(self) -> None:
        # abort, not close: nothing more is wanted from the peer, and a graceful TLS close could
        # wait on it.
        self._writer.transport.abort()


async def system_resolve(host: str) -> list[IPAddress]:
    """The OS resolver: every TCP address of ``host``, in the order returned, without duplicates."""
    infos = await asyncio.get_running_loop().getaddrinfo(host, None, type=socket.SOCK_STREAM)
    found: list[IPAddress] = []
    for _family, _type, _proto, _name, sockaddr in infos:
        ip = ip_address(str(sockaddr[0]))
        if ip not in found:
            found.append(ip)
    return found


async def open_tcp(ip: IPAddress, port: int, *, tls: ssl.SSLContext | None, server_name: str) -> Connection:
    """Connect to the checked address itself; SNI and certificate checks use the host name."""
    reader, writer = await asyncio.open_connection(
        str(ip), port, ssl=tls, server_hostname=server_name if tls is not None else None
    )
    return StreamConnection(reader, writer)


@dataclass(frozen=True)
class Network:
    """What the fetcher talks to the network with; production defaults, replaced in tests."""

    resolver: Resolver = system_resolve
    dialer: Dialer = open_tcp
    # Built per Network (not at import): the system trust store, hostname checking on.
    tls: ssl.SSLContext = field(default_factory=ssl.create_default_context)
