"""Units: address classes, the URL parser, allow-list entries and settings, the five part formats."""

from __future__ import annotations

from ipaddress import ip_address
from typing import Any

import pytest
from media_harness import media_settings, messages_with

from openai_frontend.media.addresses import AddressClass, address_allowed, classify, parse_ipv4_literal
from openai_frontend.media.formats import JPEG, MP4, PNG, WAV
from openai_frontend.media.parts import InlineSource, LocalSource, RemoteSource, extract_media
from openai_frontend.media.policy import ALLOWED_MEDIA_DOMAINS_ENV, MediaSettings
from openai_frontend.media.urls import URLError, join_location, parse_remote_url
from openai_frontend.settings import FrontendSettings
from python_backend.protocol.errors import ContractError


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("127.1", "127.0.0.1"),
        ("2130706433", "127.0.0.1"),
        ("0x7f000001", "127.0.0.1"),
        ("0177.0.0.1", "127.0.0.1"),
        ("0x7f.1", "127.0.0.1"),
        ("017700000001", "127.0.0.1"),
        ("0", "0.0.0.0"),
        ("10.0.0.1.", "10.0.0.1"),
        ("example.test", None),
        ("1x2.test", None),
    ],
)
def test_ipv4_literals_in_every_inet_aton_form(text: str, expected: str | None) -> None:
    parsed = parse_ipv4_literal(text)
    assert (str(parsed) if parsed else None) == expected


@pytest.mark.parametrize("text", ["1.2.3.999", "256.1", "1.2.3.4.5", "08.1.1.1", "0x1g.2.3.4"])
def test_numeric_hosts_that_are_not_addresses_are_invalid(text: str) -> None:
    with pytest.raises(ValueError):
        parse_ipv4_literal(text)


@pytest.mark.parametrize(
    ("address", "cls"),
    [
        ("127.0.0.1", AddressClass.LOOPBACK),
        ("10.1.2.3", AddressClass.PRIVATE),
        ("172.31.0.1", AddressClass.PRIVATE),
        ("192.168.0.1", AddressClass.PRIVATE),
        ("100.64.0.1", AddressClass.SHARED),
        ("169.254.169.254", AddressClass.LINK_LOCAL),
        ("224.0.0.1", AddressClass.MULTICAST),
        ("0.0.0.0", AddressClass.UNSPECIFIED),
        ("255.255.255.255", AddressClass.BROADCAST),
        ("240.0.0.1", AddressClass.RESERVED),
        ("198.18.0.1", AddressClass.RESERVED),
        ("8.8.8.8", AddressClass.PUBLIC),
        ("203.0.113.10", AddressClass.PUBLIC),
        ("::1", AddressClass.LOOPBACK),
        ("::", AddressClass.UNSPECIFIED),
        ("::ffff:127.0.0.1", AddressClass.LOOPBACK),
        ("::ffff:169.254.169.254", AddressClass.LINK_LOCAL),
        ("::ffff:0:10.0.0.1", AddressClass.PRIVATE),
        ("::127.0.0.1", AddressClass.LOOPBACK),
        ("::8.8.8.8", AddressClass.RESERVED),
        ("64:ff9b::a9fe:a9fe", AddressClass.LINK_LOCAL),
        ("64:ff9b::808:808", AddressClass.PUBLIC),
        ("64:ff9b:1::1", AddressClass.PRIVATE),
        ("2002:a9fe:a9fe::", AddressClass.LINK_LOCAL),
        ("2002:7f00:1::1", AddressClass.LOOPBACK),
        ("2002:808:808::1", AddressClass.PUBLIC),
        ("2001::1", AddressClass.RESERVED),
        ("fd00::1", AddressClass.UNIQUE_LOCAL),
        ("fc00::1", AddressClass.UNIQUE_LOCAL),
        ("fe80::1", AddressClass.LINK_LOCAL),
        ("fe80::1%eth0", AddressClass.LINK_LOCAL),
        ("fec0::1", AddressClass.SITE_LOCAL),
        ("ff02::1", AddressClass.MULTICAST),
        ("100::1", AddressClass.RESERVED),
        ("4000::1", AddressClass.RESERVED),
        ("2606:4700::1", AddressClass.PUBLIC),
    ],
)
def test_address_classes(address: str, cls: AddressClass) -> None:
    assert classify(ip_address(address)) is cls


def test_private_opt_out_allows_private_use_only() -> None:
    for text in ("10.0.0.1", "100.64.0.1", "fd00::1", "fec0::1"):
        assert not address_allowed(ip_address(text), allow_private=False)
        assert address_allowed(ip_address(text), allow_private=True)
    for text in ("127.0.0.1", "169.254.169.254", "::1", "fe80::1", "0.0.0.0", "224.0.0.1", "::ffff:127.0.0.1"):
        assert not address_allowed(ip_address(text), allow_private=True)


@pytest.mark.parametrize(
    ("url", "host", "port", "target"),
    [
        ("http://allowed.test/a.png", "allowed.test", 80, "/a.png"),
        ("HTTPS://ALLOWED.TEST./a.png?x=1#frag", "allowed.test", 443, "/a.png?x=1"),
        ("http://allowed.test:8080", "allowed.test", 8080, "/"),
        ("http://allowed.test?q", "allowed.test", 80, "/?q"),
        ("http://127.0.0.1#@allowed.test/", "127.0.0.1", 80, "/"),
        ("http://[::ffff:127.0.0.1]:81/x", "::ffff:7f00:1", 81, "/x"),
        ("http://0x7f000001/", "127.0.0.1", 80, "/"),
    ],
)
def test_url_parser_normal_forms(url: str, host: str, port: int, target: str) -> None:
    parsed = parse_remote_url(url)
    assert (parsed.host, parsed.port, parsed.target) == (host, port, target)


@pytest.mark.parametrize(
    "url",
    [
        "http://allowed.test\\@127.0.0.1/",
        "http://allowed.test@127.0.0.1/",
        "http://%61llowed.test/",
        "http://allowed.test:/",
        "http://allowed.test:0/",
        "http://allowed.test:65536/",
        "http://[fe80::1%25eth0]/",
        "http://[::1]x/",
        "http://a..b/",
        "http:/allowed.test/",
        "http://аllowed.test/",
        "http://allowed.test /",
        "http://",
        "ftp://allowed.test/",
    ],
)
def test_url_parser_refuses_ambiguous_urls(url: str) -> None:
    with pytest.raises(URLError):
        parse_remote_url(url)


def test_join_location() -> None:
    base = parse_remote_url("http://allowed.test:8080/a/b.png?x")
    assert join_location(base, "http://other.test/c") == "http://other.test/c"
    assert join_location(base, "//cdn.test/c") == "http://cdn.test/c"
    assert join_location(base, "/c.png") == "http://allowed.test:8080/c.png"
    assert join_location(base, "c.png") == "http://allowed.test:8080/a/c.png"
    assert join_location(base, "?y") == "http://allowed.test:8080/a/b.png?y"


def test_allow_list_from_env_is_exact_and_port_aware() -> None:
    env = {ALLOWED_MEDIA_DOMAINS_ENV: " Media.Test. , cdn.test:8443,1.2.3.4,, [2001:db8::1]:8080"}
    settings = MediaSettings.from_env(env)

    def allows(url: str) -> bool:
        return settings.allows(parse_remote_url(url))

    assert allows("http://media.test/a") and allows("https://MEDIA.test./a")
    assert not allows("http://media.test:8080/a") and not allows("http://sub.media.test/a")
    assert not allows("http://evilmedia.test/a") and not allows("http://media.test.evil.test/a")
    assert allows("https://cdn.test:8443/a") and not allows("https://cdn.test/a")
    assert allows("http://1.2.3.4/") and allows("http://0x01020304/") and allows("http://[2001:db8::1]:8080/")


def test_empty_allow_list_fails_closed_and_star_is_explicit() -> None:
    assert MediaSettings.from_env({}).allowed_domains == ()
    assert not MediaSettings.from_env({}).allows(parse_remote_url("http://allowed.test/"))
    assert not MediaSettings.from_env({ALLOWED_MEDIA_DOMAINS_ENV: " , "}).allows(parse_remote_url("http://a.test/"))
    star = MediaSettings.from_env({ALLOWED_MEDIA_DOMAINS_ENV: "*"})
    assert star.allow_any_host and star.allows(parse_remote_url("https://any.test/"))
    assert not star.allows(parse_remote_url("http://any.test:22/"))
    assert FrontendSettings(served_model_name="m").media.allowed_domains == ()


@pytest.mark.parametrize("entry", ["*.allowed.test", "http://a.test", "a.test/x", "a test", "*,a.test", "a.test:99999"])
def test_bad_allow_list_entries_fail_at_start_up(entry: str) -> None:
    with pytest.raises(ValueError):
        MediaSettings.from_env({ALLOWED_MEDIA_DOMAINS_ENV: entry})


def test_the_five_part_formats_become_refs_and_internal_parts() -> None:
    settings = media_settings("/srv/media", allowed_domains=("allowed.test",))
    content: list[dict[str, Any]] = [
        {"type": "text", "text": "compare"},
        {"type": "image_url", "image_url": "demo.png"},
        {"type": "image_url", "image_url": {"url": "http://allowed.test/cat.png"}},
        {"type": "image_url", "image_url": {"url": "file://sub/dog.jpg"}},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}},
        {"type": "input_audio", "input_audio": {"data": "UklGRg==", "format": "WAV"}},
        {"type": "image_url", "image_url": "/9j/4AAQ"},
        {"type": "video_url", "video_url": {"url": "/srv/media/clips/a.mp4"}},
    ]
    parsed = extract_media([{"role": "system", "content": "s"}, {"role": "user", "content": content}], settings)
    kinds = [(ref.kind, type(ref.source), ref.declared) for ref in parsed.refs]
    assert kinds == [
        ("image", LocalSource, PNG),
        ("image", RemoteSource, PNG),
        ("image", LocalSource, JPEG),
        ("image", InlineSource, PNG),
        ("audio", InlineSource, WAV),
        ("image", InlineSource, JPEG),
        ("video", LocalSource, MP4),
    ]
    assert parsed.refs[6].source == LocalSource(("clips", "a.mp4"))
    assert parsed.refs[2].source == LocalSource(("sub", "dog.jpg"))
    assert parsed.messages[0] == {"role": "system", "content": "s"}
    assert parsed.messages[1]["content"] == [{"type": "text", "text": "compare"}] + [
        {"type": kind, "media_index": i} for i, (kind, _, _) in enumerate(kinds)
    ]
    assert [ref.param for ref in parsed.refs][4] == "messages.1.content.5.input_audio"
    assert parsed.refs[4].cap == settings.max_base64_audio_bytes


@pytest.mark.parametrize(
    ("value", "part_type", "code"),
    [
        ({"data": "AAAA"}, "input_audio", "invalid_media_reference"),
        ({"data": "AAAA", "format": "ogg"}, "input_audio", "invalid_media_reference"),
        ({"data": 5, "format": "wav"}, "input_audio", "invalid_media_reference"),
        ({"href": "x"}, "image_url", "invalid_media_reference"),
        (5, "image_url", "invalid_media_reference"),
        ("", "image_url", "invalid_media_reference"),
        ("data:image/png,iVBORw0KGgo=", "image_url", "invalid_media_reference"),
        ("data:audio/x-wav;base64,UklGRg==", "image_url", "invalid_media"),
        ("data:image/gif;base64,R0lGOD", "image_url", "invalid_media"),
        ("file:demo.png", "image_url", "invalid_media_reference"),
        ("/9j/AAAA", "audio_url", "media_not_allowed"),
    ],
)
def test_malformed_parts_are_400_naming_the_part(value: Any, part_type: str, code: str) -> None:
    with pytest.raises(ContractError) as caught:
        extract_media(messages_with(value, part_type), media_settings())
    assert caught.value.info.code == code
    assert caught.value.info.param == f"messages.0.content.1.{part_type}"


def test_more_than_max_items_is_refused_before_anything_else() -> None:
    parts = [{"type": "image_url", "image_url": "demo.png"}] * 3
    with pytest.raises(ContractError) as caught:
        extract_media([{"role": "user", "content": parts}], media_settings(max_items=2))
    assert (caught.value.info.code, caught.value.info.param) == ("too_many_media", "messages")
    assert len(extract_media([{"role": "user", "content": parts}], media_settings(max_items=3)).refs) == 3


def test_inline_data_over_the_cap_is_refused_before_decoding() -> None:
    big = "A" * (4 * 1024)
    with pytest.raises(ContractError) as caught:
        extract_media(
            messages_with({"data": big, "format": "wav"}, "input_audio"), media_settings(max_base64_audio_bytes=1000)
        )
    assert caught.value.info.code == "media_too_large"
