"""Where a ``tritonserver`` listens: what was asked for and what it got.

Owns ``TritonListen`` (the listeners' requested addresses and ports, 0 for a free port chosen at
start) and ``TritonEndpoints`` (the addresses and ports a started server has, and the URLs this
machine reaches them at).
"""

from __future__ import annotations

from dataclasses import dataclass

from openai_frontend.launcher.network import free_port

LOOPBACK = "127.0.0.1"


@dataclass(frozen=True)
class TritonListen:
    """Where the server's listeners are asked to bind; port 0: a free port chosen at start."""

    grpc_address: str = LOOPBACK
    grpc_port: int = 0
    http_address: str = LOOPBACK
    http_port: int = 0
    metrics_address: str = LOOPBACK
    metrics_port: int = 0

    def endpoints(self) -> TritonEndpoints:
        def port(address: str, wanted: int) -> int:
            return wanted or free_port(LOOPBACK if ":" in address else address)

        return TritonEndpoints(
            LOOPBACK,
            port(self.http_address, self.http_port),
            port(self.grpc_address, self.grpc_port),
            port(self.metrics_address, self.metrics_port),
            http_address=self.http_address,
            grpc_address=self.grpc_address,
            metrics_address=self.metrics_address,
        )


@dataclass(frozen=True)
class TritonEndpoints:
    """Where a started server listens; ``host`` (loopback) is what this machine connects to
    when a listener's address is a wildcard."""

    host: str
    http_port: int
    grpc_port: int
    metrics_port: int
    http_address: str = ""  # the listener's bind address; "": ``host``
    grpc_address: str = ""
    metrics_address: str = ""

    def _reach(self, address: str) -> str:
        """The address to connect to for a listener bound to ``address``."""
        chosen = address or self.host
        if chosen in ("0.0.0.0", "::", "[::]"):
            return self.host
        return f"[{chosen}]" if ":" in chosen and not chosen.startswith("[") else chosen

    @property
    def grpc_url(self) -> str:
        """``host:port``, the form tritonclient.grpc takes."""
        return f"{self._reach(self.grpc_address)}:{self.grpc_port}"

    @property
    def http_url(self) -> str:
        return f"http://{self._reach(self.http_address)}:{self.http_port}"

    @property
    def metrics_url(self) -> str:
        return f"http://{self._reach(self.metrics_address)}:{self.metrics_port}/metrics"
