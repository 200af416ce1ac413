"""Disconnect latency: how long after a streaming client leaves does the engine free its slot?

    .venv/bin/python -m benchmarks.disconnect_latency --model DIR --trials 100 --background 8

Owns the trial: a client streams a long answer, reads three chunks and closes its connection;
the time from the close to the engine's log line "request <id> cancelled after N generated
tokens" (written when the step loop drops the request and frees its KV rows) is one sample.
The request id is the stream's ``id``, which the frontend passes to Triton. Trials run one after
another, alone or beside ``--background`` streams that keep the batch busy, and the report gives
p50 / p99 / max against the 200 ms target, and the running gauge once all is over.
"""

from __future__ import annotations

import json
import re
import sys
import threading
import time
from datetime import datetime
from pathlib import Path

import httpx

from benchmarks import servers

LOG_WAIT_S = 10.0
LINE = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) INFO \S+: request (\S+) cancelled after")


def _cancel_times(log: Path) -> dict[str, float]:
    """Request id -> epoch seconds of the engine's cancellation line (local time, as logged)."""
    found: dict[str, float] = {}
    for line in log.read_text(errors="replace").splitlines():
        match = LINE.match(line)
        if match:
            found[match.group(2)] = datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
    return found


def _trial(http: httpx.Client, log: Path) -> float | None:
    body = {"model": "bench", "messages": [{"role": "user", "content": "Tell a long story."}],
            "max_tokens": 4000, "ignore_eos": True, "stream": True}  # fmt: skip
    request_id = ""
    with http.stream("POST", "/chat/completions", json=body) as reply:
        chunks = 0
        for line in reply.iter_lines():
            if line.startswith("data: {"):
                request_id = json.loads(line.removeprefix("data: "))["id"]
                chunks += 1
                if chunks == 3:
                    break
        closed = time.time()
    deadline = time.monotonic() + LOG_WAIT_S
    while time.monotonic() < deadline:
        seen = _cancel_times(log).get(request_id)
        if seen is not None:
            return max(seen - closed, 0.0)
        time.sleep(0.05)
    return None


def _background(base_url: str, stop: threading.Event) -> None:
    body = {"model": "bench", "messages": [{"role": "user", "content": "Keep going."}],
            "max_tokens": 256, "ignore_eos": True, "stream": True}  # fmt: skip
    with httpx.Client(base_url=base_url, timeout=300) as http:
        while not stop.is_set():
            with http.stream("POST", "/chat/completions", json=body) as reply:
                for _ in reply.iter_lines():
                    if stop.is_set():
                        break


def main() -> None:
    parser = servers.served_model_parser(__doc__, "model folder")
    parser.add_argument("--trials", type=int, default=100)
    parser.add_argument("--background", type=int, default=0, help="streams kept running beside the trials")
    parser.add_argument("--log", type=Path, default=Path("benchmarks/results/disconnect-server.log"))
    args = parser.parse_args()
    args.log.parent.mkdir(parents=True, exist_ok=True)
    triton_log = args.log.with_name(args.log.stem + "-tritonserver.log")
    extra = ("--triton-log", str(triton_log), "--max-seq-len", "8192", "--max-iter-times", "4096")
    server = servers.ours(args.model, args.dtype, args.log, extra_args=extra)
    server.start()
    stop = threading.Event()
    load = [threading.Thread(target=_background, args=(server.base_url, stop)) for _ in range(args.background)]
    samples: list[float | None] = []
    try:
        for thread in load:
            thread.start()
        time.sleep(2.0 if load else 0.0)
        with httpx.Client(base_url=server.base_url, timeout=120) as http:
            samples = [_trial(http, triton_log) for _ in range(args.trials)]
    finally:
        stop.set()
        for thread in load:
            thread.join(60)
        running = httpx.get(server.base_url.removesuffix("/v1") + "/metrics", timeout=10).text
        server.stop()
    seen = sorted(s for s in samples if s is not None)
    gauge = [line for line in running.splitlines() if line.startswith("num_requests_running")]

    def pick(q: float) -> float | None:
        return round(seen[min(int(q * len(seen)), len(seen) - 1)] * 1e3, 1) if seen else None

    report = {
        "trials": args.trials,
        "background_streams": args.background,
        "not_seen": args.trials - len(seen),
        "freed_after_ms": {"p50": pick(0.5), "p99": pick(0.99), "max": pick(1.0)},
        "target_p99_ms": 200,
        "running_gauge_after": gauge,
    }
    sys.stdout.write(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
