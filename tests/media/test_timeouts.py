"""B5: fetch deadlines and retries, with scaled-down timeouts (whole fetch 2 s, connect 0.5 s).

A slow-drip origin (1 byte every 0.5 s) and one that never answers are cut at the deadline +-1 s;
a connect that never completes costs ``connect_timeout_s`` per attempt; 4xx is final, 5xx and
failed connects are retried ``fetch_retries`` times against the same checked address.
"""

from __future__ import annotations

import time

import pytest
from media_dns import PUBLIC_IP
from media_harness import load, media_settings, refusal
from media_net import TestNet
from media_samples import png
from media_servers import Handler, body, sequence, stall, status, stream

from openai_frontend.media.policy import MediaSettings

DEADLINE_S = 2.0


def settings(**overrides: object) -> MediaSettings:
    values: dict[str, object] = {"fetch_timeout_s": DEADLINE_S, "connect_timeout_s": 0.5, "fetch_retries": 1}
    values.update(overrides)
    return media_settings(**values)


@pytest.mark.parametrize(
    "handler",
    [
        stream({"Content-Length": "1000", "Content-Type": "image/png"}, b"\x89", interval_s=0.5),
        stall(),
    ],
    ids=["slow-drip", "no-answer"],
)
async def test_download_is_cut_at_the_deadline(net: TestNet, handler: Handler) -> None:
    net.origin.routes["/slow.png"] = handler
    started = time.monotonic()
    info = await refusal(settings(), net.network(), "http://allowed.test/slow.png")
    elapsed = time.monotonic() - started
    assert info.code == "media_timeout"
    assert DEADLINE_S - 1 <= elapsed <= DEADLINE_S + 1, elapsed
    assert len(net.origin.requests) == 1  # a deadline is not retried


async def test_connect_timeout_per_attempt_and_one_retry(net: TestNet) -> None:
    net.hang.add(PUBLIC_IP)
    started = time.monotonic()
    info = await refusal(settings(), net.network(), "http://allowed.test/a.png")
    elapsed = time.monotonic() - started
    assert info.code == "media_fetch_failed"
    # Two attempts of about 0.5 s each; the upper bound only says it did not hang (a busy machine
    # adds its own delay), the dials below say how many attempts there were.
    assert 0.9 <= elapsed <= 5.0, elapsed
    assert [ip for ip, _, _ in net.dials] == [PUBLIC_IP, PUBLIC_IP]
    assert net.resolutions == ["allowed.test"]  # retries reuse the checked address


@pytest.mark.parametrize("code", [400, 403, 404, 410])
async def test_client_errors_from_the_origin_are_final(net: TestNet, code: int) -> None:
    net.origin.routes["/a.png"] = status(code)
    assert (await refusal(settings(fetch_retries=3), net.network(), "http://allowed.test/a.png")).code == (
        "media_fetch_failed"
    )
    assert len(net.origin.requests) == 1


async def test_server_errors_are_retried_with_backoff_then_fail(net: TestNet) -> None:
    net.origin.routes["/a.png"] = status(503)
    started = time.monotonic()
    info = await refusal(settings(fetch_retries=2, retry_backoff_s=0.1), net.network(), "http://allowed.test/a.png")
    assert info.code == "media_fetch_failed"
    assert len(net.origin.requests) == 3
    assert time.monotonic() - started >= 0.1 + 0.2  # doubling back-off


async def test_a_recovering_origin_is_fetched_on_retry(net: TestNet) -> None:
    net.origin.routes["/a.png"] = sequence(status(502), body(png(), "image/png"))
    [(data, _)] = await load(settings(), net.network(), "http://allowed.test/a.png")
    assert data == png()
    assert len(net.origin.requests) == 2


async def test_retries_stop_at_zero_when_configured(net: TestNet) -> None:
    net.origin.routes["/a.png"] = status(500)
    await refusal(settings(fetch_retries=0), net.network(), "http://allowed.test/a.png")
    assert len(net.origin.requests) == 1
