"""The test network handed to the media fetcher: a resolver and a dialer that keep traffic on loopback.

``TestNet.dial`` records every dial. The test-public address (``PUBLIC_IP``) is connected to the
origin fixture on 127.0.0.1; a canary address (127.0.0.2-127.0.0.9) is connected to its canary for
real, so a policy failure shows up as a canary hit; every other address is never dialed: it is
recorded in ``violations`` and refused. ``resolve`` asks the dnslib fixture and records each call.
"""

from __future__ import annotations

import asyncio
import ssl
from dataclasses import dataclass, field
from ipaddress import IPv4Address

from media_dns import PUBLIC_IP, FixtureDNS, dns_lookup
from media_servers import FixtureServer

from openai_frontend.media.addresses import IPAddress
from openai_frontend.media.net import Connection, Network, StreamConnection


class CountingConnection:
    """A connection that adds every byte it reads to its ``TestNet``'s count."""

    def __init__(self, inner: Connection, net: TestNet) -> None:
        self._inner = inner
        self._net = net

    async def read(self, max_bytes: int) -> bytes:
        data = await self._inner.read(max_bytes)
        self._net.bytes_read += len(data)
        return data

    async def write(self, data: bytes) -> None:
        await self._inner.write(data)

    def close(self) -> None:
        self._inner.close()


@dataclass
class TestNet:
    __test__ = False  # not a pytest test class

    dns: FixtureDNS
    origin: FixtureServer
    canaries: dict[str, FixtureServer]
    tls_origin: FixtureServer | None = None
    tls: ssl.SSLContext = field(default_factory=ssl.create_default_context)
    hang: set[IPAddress] = field(default_factory=set)  # addresses whose connect never completes
    resolutions: list[str] = field(default_factory=list)
    dials: list[tuple[IPAddress, int, str]] = field(default_factory=list)
    violations: list[tuple[IPAddress, int]] = field(default_factory=list)
    bytes_read: int = 0

    async def resolve(self, host: str) -> list[IPAddress]:
        self.resolutions.append(host)
        return await dns_lookup(self.dns.port, host)

    async def dial(self, ip: IPAddress, port: int, *, tls: ssl.SSLContext | None, server_name: str) -> Connection:
        self.dials.append((ip, port, server_name))
        if ip in self.hang:
            await asyncio.sleep(3600)
        if ip == PUBLIC_IP:
            target = self.tls_origin if tls is not None and self.tls_origin is not None else self.origin
        elif isinstance(ip, IPv4Address) and str(ip) in self.canaries:
            target = self.canaries[str(ip)]
        else:
            self.violations.append((ip, port))
            raise ConnectionRefusedError("test dialer: address outside the test network")
        reader, writer = await asyncio.open_connection(
            target.host, target.port, ssl=tls, server_hostname=server_name if tls is not None else None
        )
        return CountingConnection(StreamConnection(reader, writer), self)

    def network(self) -> Network:
        return Network(resolver=self.resolve, dialer=self.dial, tls=self.tls)

    def canary_hits(self) -> int:
        return sum(canary.hits for canary in self.canaries.values())

    def assert_untouched(self) -> None:
        """No dial at all, hence no canary hit and no violation."""
        assert self.dials == [], self.dials
        assert self.violations == []
        assert self.canary_hits() == 0
