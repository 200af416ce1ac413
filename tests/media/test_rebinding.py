"""B3: DNS rebinding, 0 canary hits in 100 trials.

The dnslib fixture answers ``rebind-*.allowed.test`` with the test-public address on odd A queries
and canary 127.0.0.2 on even ones, TTL 0. Because the fetcher resolves once, checks every answer
and dials the checked address, each trial either gets the public origin or is refused; the
canary is never reached and the resolver is asked exactly once per trial. The control shows a
fetcher that looks the name up again at connect time would reach the canary.
"""

from __future__ import annotations

import itertools
import ssl

import pytest
from media_dns import PUBLIC_IP, dns_lookup
from media_harness import load, media_settings
from media_net import TestNet
from media_samples import png
from media_servers import body, redirect

from openai_frontend.media.addresses import IPAddress
from openai_frontend.media.net import Connection
from python_backend.protocol.errors import ContractError

IMAGE = png()
TRIALS = 100


async def test_100_rebinding_trials_never_reach_the_canary(net: TestNet) -> None:
    name = "rebind-trials.allowed.test"
    net.origin.fallback = body(IMAGE, "image/png")
    settings = media_settings(allowed_domains=(name,))
    fetched = refused = 0
    for _ in range(TRIALS):
        try:
            [(data, _)] = await load(settings, net.network(), f"http://{name}/a.png")
        except ContractError as exc:
            assert exc.info.code == "media_not_allowed"
            refused += 1
        else:
            assert data == IMAGE
            fetched += 1
    assert net.canaries["127.0.0.2"].hits == 0 and net.canary_hits() == 0
    assert net.violations == []
    assert {ip for ip, _, _ in net.dials} == {PUBLIC_IP}
    assert net.resolutions == [name] * TRIALS  # exactly one lookup per trial
    assert (fetched, refused) == (TRIALS // 2, TRIALS // 2)


async def test_each_redirect_hop_resolves_once_and_is_rechecked(net: TestNet) -> None:
    name = "rebind-hops.allowed.test"
    net.origin.fallback = body(IMAGE, "image/png")
    net.origin.routes["/start"] = redirect(f"http://{name}/next")
    settings = media_settings(allowed_domains=("allowed.test", name), follow_redirects=True)
    # First lookup of the name (odd) is public: hop 1 fetched. Second lookup (even) is the canary.
    with pytest.raises(ContractError) as caught:
        await load(settings, net.network(), f"http://{name}/start")
    assert caught.value.info.code == "media_not_allowed"
    assert net.resolutions == [name, name]
    assert net.canary_hits() == 0


async def test_control_a_second_lookup_at_connect_time_would_be_rebound(net: TestNet) -> None:
    """Sensitivity: a dialer that resolves the name again (the classic TOCTOU) hits the canary."""
    name = "rebind-control.allowed.test"
    lookups = itertools.count()

    async def resolving_dialer(ip: IPAddress, port: int, *, tls: ssl.SSLContext | None, server_name: str) -> Connection:
        next(lookups)
        [again] = await dns_lookup(net.dns.port, server_name)
        return await net.dial(again, port, tls=tls, server_name=server_name)

    network = net.network()
    naive = type(network)(resolver=network.resolver, dialer=resolving_dialer, tls=network.tls)
    await load(media_settings(allowed_domains=(name,)), naive, f"http://{name}/a.png")
    assert net.canaries["127.0.0.2"].hits == 1
