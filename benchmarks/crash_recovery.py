"""Crash recovery in cycles: kill the model's process again and again and time what a client sees.

    .venv/bin/python -m benchmarks.crash_recovery --model DIR --cycles 10

Owns the cycle: with ``triton-chat serve`` running (``--max-restarts`` raised so that the
supervisor keeps restarting), for each signal (SIGKILL, SIGSEGV) and each state (a stream in
flight, idle) and each cycle, send the signal to the Python-backend stub and measure, from the
kill: when the stream in flight ended and how (error event, then ``[DONE]``), when a new request
got 503 with ``Retry-After``, when readiness said 503, when a request was answered again, and
whether the dead stub's shared memory was removed. Prints one JSON report: every cycle, the worst
of each figure against the recovery bounds (streams end within 1 s, readiness 503 within 2 s), and the server's start-up time for scale
("first 200 within load time + 5 s").
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx

from benchmarks import servers
from benchmarks.soak import served_processes
from openai_frontend.launcher.tritonserver import SHM_DIR, SHM_PREFIX

RECOVERY_TIMEOUT_S = 300.0
BOUNDS_S = {"stream_ended_s": 2.0, "refused_s": 1.0, "unready_s": 2.0}


@dataclass
class Cycle:
    signal: str
    state: str  # "stream" (a stream in flight) or "idle"
    stream_ended_s: float | None = None
    stream_ended_cleanly: bool | None = None  # error event, then [DONE]
    refused_s: float | None = None  # first new request answered 503 with Retry-After
    refused_code: str | None = None
    unready_s: float | None = None
    answered_again_s: float | None = None
    shm_left: list[str] = field(default_factory=list)


def _stub(launcher_pid: int) -> tuple[int, list[str]]:
    """The model's process under the launcher, and the shared-memory regions its command line names."""
    stub = served_processes(launcher_pid).get("stub")
    if stub is None:
        raise RuntimeError("no model process found")
    return stub.pid, [a for a in stub.cmdline() if a.startswith(SHM_PREFIX)]


class _Stream:
    """One long streamed answer read on a thread; records when and how it ended."""

    def __init__(self, base_url: str) -> None:
        self.started = threading.Event()
        self.ended = threading.Event()
        self.events: list[str] = []
        self._thread = threading.Thread(target=self._read, args=(base_url,), daemon=True)
        self._thread.start()

    def _read(self, base_url: str) -> None:
        body = {"model": "bench", "messages": [{"role": "user", "content": "Tell a long story."}],
                "max_tokens": 4000, "ignore_eos": True, "stream": True}  # fmt: skip
        try:
            with (
                httpx.Client(base_url=base_url, timeout=120) as http,
                http.stream("POST", "/chat/completions", json=body) as reply,
            ):
                for line in reply.iter_lines():
                    if line.startswith("data: "):
                        self.events.append(line.removeprefix("data: "))
                        if len(self.events) >= 3:
                            self.started.set()
        except httpx.HTTPError as exc:
            self.events.append(f"client error: {exc}")
        finally:
            self.ended.set()

    @property
    def ended_cleanly(self) -> bool:
        return len(self.events) >= 2 and self.events[-1] == "[DONE]" and "err_msg" in self.events[-2]


def _until(condition: Callable[[], bool], timeout: float, interval: float = 0.02) -> float | None:
    """Seconds until ``condition()`` held (polled), or None when it did not within ``timeout``."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if condition():
            return time.monotonic() - started
        time.sleep(interval)
    return None


def run_cycle(base_url: str, launcher_pid: int, signum: signal.Signals, state: str) -> Cycle:
    cycle = Cycle(signum.name, state)
    root = base_url.removesuffix("/v1")
    plain = {"model": "bench", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    stream = _Stream(base_url) if state == "stream" else None
    if stream is not None and not stream.started.wait(60):
        raise RuntimeError("the stream did not start")
    stub, regions = _stub(launcher_pid)
    os.kill(stub, signum)
    killed = time.monotonic()
    with httpx.Client(timeout=30) as http:
        reply = http.post(f"{base_url}/chat/completions", json=plain)
        if reply.status_code == 503 and reply.headers.get("retry-after"):
            cycle.refused_s = time.monotonic() - killed
        cycle.refused_code = f"{reply.status_code} {reply.json().get('error', {}).get('code')}"
        _until(lambda: http.get(f"{root}/health/ready").status_code == 503, 10)
        cycle.unready_s = time.monotonic() - killed
        if stream is not None:
            stream.ended.wait(10)
            cycle.stream_ended_s = time.monotonic() - killed if stream.ended.is_set() else None
            cycle.stream_ended_cleanly = stream.ended_cleanly
        _until(
            lambda: http.post(f"{base_url}/chat/completions", json=plain).status_code == 200, RECOVERY_TIMEOUT_S, 0.25
        )
        cycle.answered_again_s = time.monotonic() - killed
    cycle.shm_left = [r for r in regions if (SHM_DIR / r).exists()]
    return cycle


def main() -> None:
    parser = servers.served_model_parser(__doc__, "model folder")
    parser.add_argument("--cycles", type=int, default=10, help="cycles per signal and state")
    parser.add_argument("--log", type=Path, default=Path("benchmarks/results/crash-recovery-server.log"))
    args = parser.parse_args()
    args.log.parent.mkdir(parents=True, exist_ok=True)
    extra = ("--max-restarts", str(4 * args.cycles + 1), "--max-seq-len", "8192", "--max-iter-times", "4096")
    server = servers.ours(args.model, args.dtype, args.log, extra_args=extra)
    started = time.monotonic()
    server.start()
    startup_s = time.monotonic() - started
    cycles: list[Cycle] = []
    try:
        for signum in (signal.SIGKILL, signal.SIGSEGV):
            for state in ("stream", "idle"):
                for _ in range(args.cycles):
                    cycles.append(run_cycle(server.base_url, server.pid, signum, state))
                    sys.stderr.write(json.dumps(asdict(cycles[-1])) + "\n")
    finally:
        server.stop()
    worst = {
        name: max((getattr(c, name) for c in cycles if getattr(c, name) is not None), default=None)
        for name in (*BOUNDS_S, "answered_again_s")
    }
    report = {
        "startup_s": round(startup_s, 1),
        "cycles": len(cycles),
        "worst_s": worst,
        "bounds_s": BOUNDS_S,
        "within_bounds": {
            name: all(
                getattr(c, name) is not None and getattr(c, name) <= bound
                for c in cycles
                if name != "stream_ended_s" or c.state == "stream"
            )
            for name, bound in BOUNDS_S.items()
        },  # fmt: skip
        "streams_ended_cleanly": all(c.stream_ended_cleanly for c in cycles if c.state == "stream"),
        "refusals": sorted({c.refused_code or "" for c in cycles}),
        "shm_left": sorted({r for c in cycles for r in c.shm_left}),
        "every_cycle": [asdict(c) for c in cycles],
    }
    sys.stdout.write(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
