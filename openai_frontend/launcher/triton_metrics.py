"""Reading tritonserver's ``/metrics`` for the frontend's engine gauges.

Owns ``metrics_reader``: the function the launcher hands the app (``create_app(engine_metrics=)``),
so that the serving modules, which open no connections themselves, can show the engine's figures.
The URL is the launcher's own (the server it started, or ``--triton-metrics-url``), never request
data.
"""

from __future__ import annotations

import urllib.request
from collections.abc import Callable

READ_TIMEOUT_S = 2.0


def metrics_reader(url: str) -> Callable[[], str]:
    """A function returning Triton's metrics text; it raises ``OSError`` when Triton does not answer."""

    def read() -> str:
        with urllib.request.urlopen(url, timeout=READ_TIMEOUT_S) as response:  # noqa: S310 - the launcher's URL
            return str(response.read().decode("utf-8", "replace"))

    return read
