"""``serve``'s flags for tritonserver's own listeners: gRPC, HTTP and metrics, address and port.

Owns declaring them (``add_triton_listen_flags``) and turning them into a ``TritonListen``
(``triton_listen``). A listener given neither flag is a Unix socket only this user can open; one
given a port or an address is TCP (loopback unless said otherwise; an address other machines can
reach needs ``--allow-external``), port 0 a free one chosen at start. A fixed metrics port is what
lets a Prometheus configured in advance scrape Triton. An inference listener on TCP takes requests
without a key, so it cannot go with ``--api-key``.
"""

from __future__ import annotations

import argparse
from typing import Any

from openai_frontend.launcher.http_flags import non_negative_int
from openai_frontend.launcher.network import is_loopback
from openai_frontend.launcher.triton_endpoints import LISTENERS, LOOPBACK, PRIVATE, TritonListen

SHOWN = {"grpc": "gRPC", "http": "HTTP", "metrics": "metrics"}


def _port_or_free(text: str) -> int:
    value = non_negative_int(text)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"must be a port number 0-65535, got {value}")
    return value


def add_triton_listen_flags(group: Any) -> None:
    for listener in LISTENERS:
        shown = SHOWN[listener]
        group.add_argument(
            f"--triton-{listener}-port",
            type=_port_or_free,
            default=None,
            metavar="PORT",
            help=f"put tritonserver's {shown} listener on this TCP port (0: a free one; default: a "
            "private Unix socket, which no other local user can open)",
        )
        group.add_argument(
            f"--triton-{listener}-address",
            default=None,
            metavar="ADDRESS",
            help=f"put tritonserver's {shown} listener on TCP at this address (default: none; with a port flag: "
            f"{LOOPBACK}; others need --allow-external)",
        )


def triton_listen(parser: argparse.ArgumentParser, args: argparse.Namespace) -> TritonListen:
    """The listeners asked for; a usage error for an exposed one without ``--allow-external``, or
    an inference listener on TCP beside ``--api-key``."""
    values: dict[str, Any] = {}
    ports: dict[int, str] = {}
    for listener in LISTENERS:
        address = getattr(args, f"triton_{listener}_address")
        port = getattr(args, f"triton_{listener}_port")
        if address is None and port is None:
            values[f"{listener}_address"], values[f"{listener}_port"] = PRIVATE, 0
            continue
        address = LOOPBACK if address is None else address
        if not is_loopback(address) and not args.allow_external:
            parser.error(
                f"--triton-{listener}-address {address} would let other machines reach tritonserver, "
                "which has no authentication; add --allow-external to confirm"
            )
        if listener != "metrics" and getattr(args, "api_keys", None):
            parser.error(
                f"--triton-{listener}-{'port' if port is not None else 'address'} puts tritonserver's "
                f"{SHOWN[listener]} listener on TCP, where it takes inference without a key: it cannot go "
                "with --api-key (drop it, and tritonserver stays on a private socket)"
            )
        if port and port in ports:
            parser.error(f"--triton-{listener}-port {port} is also --triton-{ports[port]}-port")
        if port:
            ports[port] = listener
        values[f"{listener}_address"] = address
        values[f"{listener}_port"] = port or 0
    return TritonListen(**values)
