"""Who may use a ``tritonserver``'s APIs, and which Triton versions are safe to run.

Owns ``RestrictedAccess`` (a per-start secret that Triton itself requires on its administrative
APIs, and the flags and headers that carry it) and ``version_problem`` (what is wrong with a
server version in production). Only a listener the user exposed on a TCP port needs it: by
default every listener is a Unix socket no other user can open (``triton_endpoints``), and the
frontend and launcher never call these APIs, so no caller is ever given the secret. Triton takes
it only on its command line, which local users can read, so it keeps other machines off an
exposed listener's administrative APIs, not local users (docs/security.md).
"""

from __future__ import annotations

import re
import secrets
from dataclasses import dataclass, field

# The header that carries the per-start secret of a restricted server (gRPC keys are lowercase).
SECRET_HEADER = "triton-chat-secret"
GRPC_HEADER_PREFIX = "triton-grpc-protocol-"
# Triton's APIs that act on the server itself: with them a local process could map the stub's
# shared memory (the first step of the published shared-memory exploit chain) or load models.
ADMIN_APIS = ("shared-memory", "model-repository", "trace", "logging")
# tritonserver 2.59 (NGC 25.07) fixed the published shared-memory and HTTP CVEs (August 2025).
FIXED_VERSION = (2, 59)


@dataclass(frozen=True)
class RestrictedAccess:
    """Triton APIs that answer only calls carrying ``SECRET_HEADER`` with this start's secret.

    Triton checks the header itself (``--grpc-restricted-protocol``, ``--http-restricted-api``).
    """

    apis: tuple[str, ...] = ADMIN_APIS
    secret: str = field(default_factory=lambda: secrets.token_urlsafe(32), repr=False)

    @property
    def http_headers(self) -> dict[str, str]:
        return {SECRET_HEADER: self.secret}

    @property
    def grpc_headers(self) -> dict[str, str]:
        """Triton's gRPC endpoint expects a restricted protocol's header under its own prefix."""
        return {GRPC_HEADER_PREFIX + SECRET_HEADER: self.secret}

    def flags(self) -> list[str]:
        rule = f"{','.join(self.apis)}:{SECRET_HEADER}={self.secret}"
        return [f"--grpc-restricted-protocol={rule}", f"--http-restricted-api={rule}"]


def version_problem(version: str | None) -> str | None:
    """What is wrong with running tritonserver ``version`` in production, if anything."""
    if version is None:
        return "tritonserver did not say its version; make sure it is 2.59 (NGC 25.07) or newer"
    numbers = tuple(int(part) for part in re.findall(r"\d+", version)[:2])
    if numbers >= FIXED_VERSION:
        return None
    return (
        f"tritonserver {version} is older than 2.59 (NGC 25.07), the release that fixed the published "
        "shared-memory and HTTP vulnerabilities (CVE-2025-23319/23320/23334, CVE-2025-23310/23311); "
        "in production run the NGC Triton container 25.07 or newer (docs/security.md)"
    )
