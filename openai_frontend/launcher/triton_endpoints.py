"""Where a ``tritonserver`` listens: what was asked for and what it got.

Owns ``TritonListen`` (the listeners' requested addresses and ports), ``Listener`` (where one
started listener is and how this machine reaches it) and ``TritonEndpoints`` (the three of a
started server). A listener nobody asked for binds a Unix socket in a directory only this user
may enter (``private_socket_dir``): no other local user can connect to it, which is what keeps
tritonserver from being a way around the frontend's key and limits (docs/security.md). A listener
given a port or an address binds TCP there, for tools that call Triton directly.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

from openai_frontend.launcher.network import free_port

LOOPBACK = "127.0.0.1"
PRIVATE = ""  # a listener's address when nobody asked for one: a Unix socket of the server's own
UNIX = "unix:"  # how Triton (gRPC and its HTTP server alike) is told to bind a Unix socket
LISTENERS = ("grpc", "http", "metrics")
# sun_path holds 108 bytes on Linux; the socket names below are at most 10.
_MAX_SOCKET_DIR = 90


@dataclass(frozen=True)
class TritonListen:
    """Where the server's listeners are asked to bind. A ``PRIVATE`` address is a Unix socket;
    any other is TCP, on the port given or, for port 0, a free one chosen at start."""

    grpc_address: str = PRIVATE
    grpc_port: int = 0
    http_address: str = PRIVATE
    http_port: int = 0
    metrics_address: str = PRIVATE
    metrics_port: int = 0

    @classmethod
    def loopback(cls) -> TritonListen:
        """Every listener on a free loopback TCP port, reachable by every local user."""
        return cls(LOOPBACK, 0, LOOPBACK, 0, LOOPBACK, 0)

    @property
    def exposed(self) -> tuple[str, ...]:
        """The listeners that bind TCP, which any local user (or more) can reach."""
        return tuple(name for name in LISTENERS if getattr(self, f"{name}_address") != PRIVATE)

    def endpoints(self, socket_dir: Path | None = None) -> TritonEndpoints:
        """Choose the free ports; ``socket_dir`` holds the private listeners' sockets."""

        def listener(name: str) -> Listener:
            address, port = getattr(self, f"{name}_address"), getattr(self, f"{name}_port")
            if address != PRIVATE:
                return Listener(address, port or free_port(LOOPBACK if ":" in address else address))
            if socket_dir is None:
                raise ValueError(f"the {name} listener is a Unix socket: give its directory")
            # Triton appends ":<port>" to a gRPC address, so its socket is named with the port.
            return Listener(UNIX + str(socket_dir / name), 0)

        return TritonEndpoints(listener("grpc"), listener("http"), listener("metrics"))


@dataclass(frozen=True)
class Listener:
    """One started listener: ``address`` is what tritonserver binds (an IP, or ``unix:<path>``)."""

    address: str
    port: int

    @property
    def socket_path(self) -> str | None:
        """The Unix socket's path as HTTP clients connect to it; None for TCP."""
        return self.address[len(UNIX) :] if self.address.startswith(UNIX) else None

    @property
    def host(self) -> str:
        """The address to connect to: loopback for a wildcard listener, brackets around IPv6."""
        if self.address in ("0.0.0.0", "::", "[::]"):
            return LOOPBACK
        return f"[{self.address}]" if ":" in self.address and not self.address.startswith("[") else self.address

    def http_url(self, path: str = "") -> str:
        """An ``http://`` URL for TCP; for a socket, ``http+unix://`` (shown, not fetched by urllib)."""
        if self.socket_path is not None:
            return f"http+unix://{self.socket_path}{path}"
        return f"http://{self.host}:{self.port}{path}"


@dataclass(frozen=True)
class TritonEndpoints:
    """Where a started server's three listeners are."""

    grpc: Listener
    http: Listener
    metrics: Listener

    @property
    def grpc_url(self) -> str:
        """``host:port`` or ``unix:<path>:<port>``: the target tritonclient.grpc takes."""
        if self.grpc.socket_path is not None:
            return f"{self.grpc.address}:{self.grpc.port}"
        return f"{self.grpc.host}:{self.grpc.port}"

    @property
    def grpc_socket(self) -> Path | None:
        """The file of gRPC's Unix socket (named with its port, as Triton binds it)."""
        path = self.grpc.socket_path
        return Path(f"{path}:{self.grpc.port}") if path is not None else None

    @property
    def http_url(self) -> str:
        return self.http.http_url()

    @property
    def metrics_url(self) -> str:
        return self.metrics.http_url("/metrics")

    def sockets(self) -> list[Path]:
        """Every Unix socket file the server binds (to remove before it binds them again)."""
        found = [self.grpc_socket] + [Path(p) for p in (self.http.socket_path, self.metrics.socket_path) if p]
        return [path for path in found if path is not None]


def private_socket_dir() -> Path:
    """A new directory only this user may enter (mode 0700), short enough for socket paths."""
    base = tempfile.gettempdir()
    if len(base) > _MAX_SOCKET_DIR - 20:
        base = "/tmp"  # noqa: S108 - a 0700 directory of our own inside it; TMPDIR is too long for sun_path
    return Path(tempfile.mkdtemp(prefix="triton-chat-", dir=base))
