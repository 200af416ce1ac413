"""What the served model costs when nothing happens: each process's CPU over an idle window.

Starts ``triton-chat serve``, sends one request (so that lazy set-up is done), waits for the
server to settle, then measures every process of its tree over ``--seconds`` with no request,
as a percentage of one core. A server beside other work should cost nothing when idle.

    python -m benchmarks.idle_cpu --model ~/.cache/triton-chat/models/SmolLM2-135M-Instruct --seconds 30
"""

from __future__ import annotations

import json
import sys
import tempfile
import threading
from pathlib import Path

import httpx

from benchmarks.servers import CpuShares, ours, served_model_parser


def idle_shares(model: str, dtype: str, settle_s: float, seconds: float, log: Path) -> dict[str, float]:
    server = ours(model, dtype, log)
    server.start()
    try:
        body = {"model": "bench", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
        httpx.post(f"{server.base_url}/chat/completions", json=body, timeout=120).raise_for_status()
        quiet = threading.Event()  # never set: the waits below are the measured idle time itself
        quiet.wait(settle_s)
        with CpuShares(server.pid) as cpu:
            quiet.wait(seconds)
    finally:
        server.stop()
    shares = {role: share for role, share in cpu.shares.items() if role != "client"}
    return {**shares, "total": round(sum(shares.values()), 2)}


def main() -> None:
    parser = served_model_parser(__doc__, dtype="float32")
    parser.add_argument("--settle", type=float, default=5.0, help="seconds after the request before measuring")
    parser.add_argument("--seconds", type=float, default=30.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="idle-cpu-") as logs:
        shares = idle_shares(args.model, args.dtype, args.settle, args.seconds, Path(logs) / "server.log")
    sys.stdout.write(json.dumps({"idle_cpu_percent_of_one_core": shares, "seconds": args.seconds}) + "\n")


if __name__ == "__main__":
    main()
