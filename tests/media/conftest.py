"""Fixtures of the media suite: the dnslib server, the origin and canary servers, the test network
and a media root with sample files. Everything listens on 127.0.0.x only."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import media_samples
import pytest
from media_dns import FixtureDNS
from media_net import TestNet
from media_servers import FixtureServer, start_canaries

CANARY_PNG = media_samples.png(5, 5, (1, 2, 3))


@pytest.fixture(scope="session")
def dns() -> Iterator[FixtureDNS]:
    server = FixtureDNS()
    server.start()
    yield server
    server.stop()


@pytest.fixture
async def net(dns: FixtureDNS) -> AsyncIterator[TestNet]:
    origin = await FixtureServer("127.0.0.1").start()
    canaries = await start_canaries(CANARY_PNG)
    test_net = TestNet(dns, origin, canaries)
    yield test_net
    for server in (origin, *canaries.values()):
        await server.close()


@pytest.fixture
def media_root(tmp_path: Path) -> Path:
    root = tmp_path / "multimodal_inputs"
    (root / "sub").mkdir(parents=True)
    (root / "demo.png").write_bytes(media_samples.png())
    (root / "sub" / "inner.jpg").write_bytes(media_samples.jpeg())
    (root / "clip.wav").write_bytes(media_samples.wav())
    (root / "movie.mp4").write_bytes(media_samples.mp4())
    return root
