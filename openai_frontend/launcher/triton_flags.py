"""``serve``'s flags for tritonserver's own listeners: gRPC, HTTP and metrics, address and port.

Owns declaring them (``add_triton_listen_flags``) and turning them into a ``TritonListen``
(``triton_listen``). Loopback by default like the frontend, and, like it, an address other
machines can reach needs ``--allow-external``. A port of 0 (the default) is a free one chosen at
start; a fixed metrics port is what lets a Prometheus configured in advance scrape Triton.
"""

from __future__ import annotations

import argparse
from typing import Any

from openai_frontend.launcher.http_flags import non_negative_int
from openai_frontend.launcher.network import is_loopback
from openai_frontend.launcher.triton_endpoints import LOOPBACK, TritonListen

LISTENERS = ("grpc", "http", "metrics")
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
            default=0,
            metavar="PORT",
            help=f"tritonserver's {shown} port (default: 0, a free port; printed at start)",
        )
        group.add_argument(
            f"--triton-{listener}-address",
            default=LOOPBACK,
            metavar="ADDRESS",
            help=f"tritonserver's {shown} address (default: {LOOPBACK}; others need --allow-external)",
        )


def triton_listen(parser: argparse.ArgumentParser, args: argparse.Namespace) -> TritonListen:
    """The listeners asked for; a usage error for an exposed one without ``--allow-external``."""
    values: dict[str, Any] = {}
    ports: dict[int, str] = {}
    for listener in LISTENERS:
        address = getattr(args, f"triton_{listener}_address")
        port = getattr(args, f"triton_{listener}_port")
        if not is_loopback(address) and not args.allow_external:
            parser.error(
                f"--triton-{listener}-address {address} would let other machines reach tritonserver, "
                "which has no authentication; add --allow-external to confirm"
            )
        if port and port in ports:
            parser.error(f"--triton-{listener}-port {port} is also --triton-{ports[port]}-port")
        if port:
            ports[port] = listener
        values[f"{listener}_address"] = address
        values[f"{listener}_port"] = port
    return TritonListen(**values)
