"""HTTPS media: the fetcher dials the checked address, yet TLS (SNI and certificate check) and the
``Host`` header keep the name, so pinning the address does not weaken certificate validation."""

from __future__ import annotations

import shutil
import ssl
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from media_dns import PUBLIC_IP
from media_harness import load, media_settings, refusal
from media_net import TestNet
from media_samples import png
from media_servers import FixtureServer, body

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command to make a cert")


@pytest.fixture(scope="session")
def cert(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("tls")
    key, crt = folder / "key.pem", folder / "cert.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
        + ["-keyout", str(key), "-out", str(crt), "-days", "2", "-subj", "/CN=allowed.test"]
        + ["-addext", "subjectAltName=DNS:allowed.test,DNS:cdn.allowed.test"],
        check=True,
        capture_output=True,
    )
    return crt, key


@pytest.fixture
async def tls_net(net: TestNet, cert: tuple[Path, Path]) -> AsyncIterator[tuple[TestNet, list[str | None]]]:
    crt, key = cert
    server_names: list[str | None] = []
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(crt, key)
    server_ctx.sni_callback = lambda _sock, name, _ctx: server_names.append(name)  # type: ignore[assignment,func-returntype]
    origin = await FixtureServer("127.0.0.1", tls=server_ctx).start()
    origin.routes["/a.png"] = body(png(), "image/png")
    net.tls_origin = origin
    net.tls = ssl.create_default_context(cafile=str(crt))
    yield net, server_names
    await origin.close()


async def test_https_keeps_the_name_for_sni_host_and_certificate(tls_net: tuple[TestNet, list[str | None]]) -> None:
    net, server_names = tls_net
    [(data, _)] = await load(media_settings(), net.network(), "https://allowed.test/a.png")
    assert data == png()
    assert net.dials == [(PUBLIC_IP, 443, "allowed.test")]
    assert server_names == ["allowed.test"]
    assert net.tls_origin is not None and net.tls_origin.requests[0][1]["host"] == "allowed.test"


async def test_certificate_for_another_name_is_refused(tls_net: tuple[TestNet, list[str | None]]) -> None:
    net, _ = tls_net
    info = await refusal(
        media_settings(allowed_domains=("mixed.allowed.test", "evil.test")), net.network(), "https://evil.test/a.png"
    )
    assert info.code == "media_fetch_failed"
    assert net.tls_origin is not None and net.tls_origin.requests == []
