"""B1: SSRF vectors -> 400 with a generic message, 0 dial attempts, 0 canary hits.

Each vector runs under the normal allow-list and again with the ``*`` opt-in (any host), where the
address check is the only defence left; inward vectors also run with the private-address opt-out,
which must not open loopback, link-local or the like. The control at the end disables the address
check and shows that the same harness then sees the canary hit, so these tests can fail.
"""

from __future__ import annotations

import pytest
from media_dns import PUBLIC_IP
from media_harness import load, media_settings, refusal
from media_net import TestNet
from media_samples import png
from media_servers import body

import openai_frontend.media.fetch as fetch_module
from openai_frontend.media.policy import MediaSettings

LITERALS = [
    "http://127.0.0.1/a.png",
    "http://127.1/a.png",
    "http://2130706433/a.png",
    "http://0x7f000001/a.png",
    "http://0177.0.0.1/a.png",
    "http://0x7f.0.0.1/a.png",
    "http://017700000001/a.png",
    "http://127.0.0.1./a.png",
    "http://0/a.png",
    "http://0.0.0.0/a.png",
    "http://[::1]/a.png",
    "http://[::]/a.png",
    "http://[::ffff:127.0.0.1]/a.png",
    "http://[::ffff:7f00:2]/a.png",
    "http://[::ffff:169.254.169.254]/a.png",
    "http://[::127.0.0.1]/a.png",
    "http://[fd00::1]/a.png",
    "http://[fc00::1]/a.png",
    "http://[fe80::1]/a.png",
    "http://[fec0::1]/a.png",
    "http://[ff02::1]/a.png",
    "http://[64:ff9b::a9fe:a9fe]/a.png",
    "http://[64:ff9b::7f00:1]/a.png",
    "http://[2002:a9fe:a9fe::]/a.png",
    "http://[2002:7f00:1::]/a.png",
    "http://[2001::1]/a.png",
    "http://100.64.0.1/a.png",
    "http://169.254.169.254/latest/meta-data/",
    "http://10.0.0.1/a.png",
    "http://172.16.0.1/a.png",
    "http://192.168.1.1/a.png",
    "http://224.0.0.1/a.png",
    "http://255.255.255.255/a.png",
    "http://240.0.0.1/a.png",
    "http://198.18.0.1/a.png",
    "http://127.0.0.2/a.png",
    "http://2130706435/a.png",
    "http://0x7f000004/a.png",
    "http://0177.0.0.5/a.png",
    "http://127.6/a.png",
]

PARSER_DIFFERENTIALS = [
    "http://allowed.test\\@127.0.0.1/a.png",
    "http://allowed.test@127.0.0.1/a.png",
    "http://allowed.test:pw@127.0.0.2/a.png",
    "http://127.0.0.1#@allowed.test/a.png",
    "http://127.0.0.2?@allowed.test/a.png",
    "http://127.0.0.1%23@allowed.test/",
    "http://%31%32%37.0.0.1/a.png",
    "http://allowed%2etest/a.png",
    "http://allowed.test.evil.test/a.png",
    "http://evilallowed.test/a.png",
    "http://xn--llowed-9ve.test/a.png",
    "http://аllowed.test/a.png",
    "http://allowed.test:22/a.png",
    "http://allowed.test:8080/a.png",
    "https://allowed.test:80/a.png",
    "http://allowed.test:0/a.png",
    "http://allowed.test:/a.png",
    "http://[allowed.test]/a.png",
    "http:\\\\allowed.test\\a.png",
    "http:/allowed.test/a.png",
    "http://allowed.test /a.png",
    "http://allowed.test\t@127.0.0.1/",
    "http://allowed.test\r\nHost: 127.0.0.1/a.png",
    " http://127.0.0.1/a.png",
]

SCHEMES = [
    "file:///etc/passwd",
    "file://localhost/../../etc/passwd",
    "gopher://127.0.0.1:6379/_INFO",
    "ftp://allowed.test/a.png",
    "dict://127.0.0.1:11211/stat",
    "jar:http://allowed.test/a.jar!/a.png",
    "ldap://127.0.0.1/",
    "netdoc:///etc/passwd",
    "ws://allowed.test/a.png",
    "data:text/html;base64,PGgxPmhpPC9oMT4=",
    "data:image/svg+xml;base64,PHN2Zy8+",
    "data:application/octet-stream;base64,AAAA",
]

# Allow-listed names whose DNS answers point inward (wildcard DNS, mixed answers, AAAA).
INWARD_NAMES = [
    "http://127.0.0.1.nip.test/a.png",
    "http://127.0.0.5.nip.test/a.png",
    "http://169.254.169.254.nip.test/a.png",
    "http://127-0-0-2.sslip.test/a.png",
    "http://10-0-0-1.sslip.test/a.png",
    "http://mixed.allowed.test/a.png",
    "http://mixedv6.allowed.test/a.png",
    "http://inward.allowed.test/a.png",
    "http://private.allowed.test/a.png",
    "http://metadata.allowed.test/a.png",
    "http://v6inward.allowed.test/a.png",
    "http://mapped.allowed.test/a.png",
]

# Names whose only non-public answers are private-use (admitted by the private-address opt-out).
PRIVATE_USE_ONLY = ("private.allowed.test", "10-0-0-1.sslip.test", "mixedv6.allowed.test")
REFUSAL_CODES = {"media_not_allowed", "invalid_media_reference", "invalid_media", "media_unavailable"}


def test_the_suite_has_at_least_60_vectors() -> None:
    assert len(LITERALS + PARSER_DIFFERENTIALS + SCHEMES + INWARD_NAMES) >= 60


@pytest.mark.parametrize("any_host", [False, True], ids=["allow-list", "star"])
@pytest.mark.parametrize("url", LITERALS + PARSER_DIFFERENTIALS + SCHEMES)
async def test_vector_is_refused_without_any_dial(net: TestNet, url: str, any_host: bool) -> None:
    settings = media_settings(allowed_domains=("*",)) if any_host else media_settings()
    info = await refusal(settings, net.network(), url)
    net.assert_untouched()
    if any_host:
        # With '*' a well-formed name is looked up; these have no DNS answer (a fetch failure).
        assert info.code in REFUSAL_CODES | ({"media_fetch_failed"} if net.resolutions else set())
    else:
        assert info.code in REFUSAL_CODES
        assert net.resolutions == []  # literals are never looked up, refused names never resolved


@pytest.mark.parametrize("allow_private", [False, True], ids=["default", "private-opt-out"])
@pytest.mark.parametrize("url", INWARD_NAMES)
async def test_allowed_name_resolving_inward_is_refused(net: TestNet, url: str, allow_private: bool) -> None:
    settings = media_settings(allow_private_addresses=allow_private)
    if allow_private and any(name in url for name in PRIVATE_USE_ONLY):
        # The opt-out admits private-use addresses, so the fetch is attempted: the test dialer
        # refuses 10.x/fd00:: (it never leaves loopback) and the origin has no such path.
        assert (await refusal(settings, net.network(), url)).code == "media_fetch_failed"
        assert net.canary_hits() == 0 and net.dials != []
        return
    info = await refusal(settings, net.network(), url)
    assert info.code == "media_not_allowed"
    net.assert_untouched()
    assert len(net.resolutions) == 1


@pytest.mark.parametrize(
    "url", ["http://127.0.0.1/a.png", "http://[::ffff:127.0.0.1]/a.png", "http://169.254.169.254/", "http://[::1]/"]
)
async def test_private_opt_out_never_opens_loopback_or_link_local(net: TestNet, url: str) -> None:
    await refusal(media_settings(allowed_domains=("*",), allow_private_addresses=True), net.network(), url)
    net.assert_untouched()


async def test_refusals_share_one_generic_message(net: TestNet) -> None:
    messages = set()
    for url in ("http://127.0.0.1/", "http://evil.test/", "gopher://x/", "http://inward.allowed.test/"):
        messages.add((await refusal(media_settings(), net.network(), url)).message)
    assert messages == {"'messages.0.content.1.image_url' names a media source that is not allowed"}


async def test_remote_media_fail_closed_by_default(net: TestNet) -> None:
    info = await refusal(MediaSettings(), net.network(), "http://allowed.test/a.png")
    assert info.code == "media_not_allowed"
    net.assert_untouched()


async def test_allowed_public_name_is_fetched_from_the_checked_address(net: TestNet) -> None:
    net.origin.routes["/a.png"] = body(png(), "image/png")
    [(data, mime)] = await load(media_settings(), net.network(), "http://ALLOWED.test./a.png")
    assert (data, mime) == (png(), "image/png")
    assert net.dials == [(PUBLIC_IP, 80, "allowed.test")]
    assert net.origin.requests[0][1]["host"] == "allowed.test"


async def test_control_without_the_address_check_the_canary_is_hit(
    net: TestNet, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Sensitivity: remove the address check and the same vector reaches the canary."""
    monkeypatch.setattr(fetch_module, "address_allowed", lambda ip, allow_private: True)
    await load(media_settings(allowed_domains=("*",)), net.network(), "http://127.0.0.2/a.png")
    assert net.canaries["127.0.0.2"].hits == 1
