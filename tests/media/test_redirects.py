"""B2: redirects are off by default; when on, at most 3 hops and every hop is checked again.

Twenty chains start at the allow-listed origin and head for loopback, ``file:``, hosts off the
allow-list, allow-listed names that resolve inward, or one hop too many: 0 canary hits, 0 dials
outside the test-public address. The 3-hop chain to a real image is the positive control.
"""

from __future__ import annotations

import pytest
from media_dns import PUBLIC_IP
from media_harness import load, media_settings, refusal
from media_net import TestNet
from media_samples import png
from media_servers import body, redirect

import openai_frontend.media.fetch as fetch_module

IMAGE = png()

CHAINS: dict[str, tuple[str, int]] = {
    "/to-loopback": ("http://127.0.0.2/a.png", 302),
    "/to-loopback-307": ("http://127.0.0.3/a.png", 307),
    "/to-v6-loopback-308": ("http://[::1]/a.png", 308),
    "/to-mapped-301": ("http://[::ffff:127.0.0.2]/a.png", 301),
    "/to-metadata-303": ("http://169.254.169.254/latest/meta-data/", 303),
    "/to-decimal": ("http://2130706439/a.png", 302),
    "/to-file": ("file:///etc/passwd", 302),
    "/to-gopher": ("gopher://127.0.0.1:6379/_INFO", 302),
    "/to-data": ("data:image/png;base64,iVBORw0KGgo=", 302),
    "/to-unlisted": ("http://evil.test/a.png", 302),
    "/to-inward-name": ("http://inward.allowed.test/a.png", 302),
    "/to-inward-name-https": ("https://inward.allowed.test/a.png", 307),
    "/to-mixed-name": ("http://mixed.allowed.test/a.png", 302),
    "/to-nip": ("http://127.0.0.5.nip.test/a.png", 302),
    "/to-other-port": ("http://allowed.test:8080/a.png", 302),
    "/to-scheme-relative-loopback": ("//127.0.0.6/a.png", 302),
    "/to-userinfo": ("http://allowed.test@127.0.0.8/a.png", 302),
    "/to-backslash": ("http:\\\\127.0.0.9\\a.png", 302),
    "/hop1": ("/hop2", 302),  # four hops: hop1 -> hop2 -> hop3 -> hop4 -> image
}


def serve_chains(net: TestNet) -> None:
    for path, (location, code) in CHAINS.items():
        net.origin.routes[path] = redirect(location, code)
    net.origin.routes["/hop2"] = redirect("/hop3")
    net.origin.routes["/hop3"] = redirect("http://allowed.test/hop4")
    net.origin.routes["/hop4"] = redirect("/image.png")
    net.origin.routes["/three"] = redirect("/hop3")  # three hops: three -> hop3 -> hop4 -> image
    net.origin.routes["/image.png"] = body(IMAGE, "image/png")
    net.origin.routes["/no-location"] = body(b"", status=302)


def test_twenty_chains() -> None:
    assert len(CHAINS) + 1 >= 20  # + the missing-Location chain


@pytest.mark.parametrize("path", [*CHAINS, "/no-location"])
async def test_chain_is_refused_with_no_canary_hit(net: TestNet, path: str) -> None:
    serve_chains(net)
    info = await refusal(media_settings(follow_redirects=True), net.network(), f"http://allowed.test{path}")
    assert info.code in {"media_not_allowed", "media_fetch_failed"}
    assert net.canary_hits() == 0 and net.violations == []
    assert {ip for ip, _, _ in net.dials} == {PUBLIC_IP}
    assert "/image.png" not in net.origin.paths()


async def test_three_hops_are_followed_and_each_hop_resolves_once(net: TestNet) -> None:
    serve_chains(net)
    [(data, mime)] = await load(media_settings(follow_redirects=True), net.network(), "http://allowed.test/three")
    assert (data, mime) == (IMAGE, "image/png")
    assert net.origin.paths() == ["/three", "/hop3", "/hop4", "/image.png"]
    assert net.resolutions == ["allowed.test"] * 4


async def test_redirects_are_not_followed_by_default(net: TestNet) -> None:
    serve_chains(net)
    info = await refusal(media_settings(), net.network(), "http://allowed.test/three")
    assert info.code == "media_fetch_failed"
    assert net.origin.paths() == ["/three"]


async def test_max_redirects_setting_is_honoured(net: TestNet) -> None:
    serve_chains(net)
    settings = media_settings(follow_redirects=True, max_redirects=2)
    assert (await refusal(settings, net.network(), "http://allowed.test/three")).code == "media_fetch_failed"
    assert net.origin.paths() == ["/three", "/hop3", "/hop4"]


async def test_redirect_to_another_allowed_host_is_fetched(net: TestNet) -> None:
    net.origin.routes["/moved"] = redirect("http://cdn.allowed.test/image.png", 308)
    net.origin.routes["/image.png"] = body(IMAGE, "image/png")
    [(data, _)] = await load(media_settings(follow_redirects=True), net.network(), "http://allowed.test/moved")
    assert data == IMAGE
    assert [name for _, _, name in net.dials] == ["allowed.test", "cdn.allowed.test"]
    assert net.origin.requests[-1][1]["host"] == "cdn.allowed.test"


async def test_control_without_the_address_check_a_redirect_reaches_the_canary(
    net: TestNet, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Sensitivity: with the per-hop address check gone, the inward redirect hits canary 127.0.0.4."""
    monkeypatch.setattr(fetch_module, "address_allowed", lambda ip, allow_private: True)
    serve_chains(net)
    await load(media_settings(follow_redirects=True), net.network(), "http://allowed.test/to-inward-name")
    assert net.canaries["127.0.0.4"].hits == 1
