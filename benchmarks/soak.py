"""Soak: the served path under a long mixed load, checked for leaks and for disconnects under load.

    .venv/bin/python -m benchmarks.soak --model DIR --duration 1800 --checkpoints 6   # 30 min
    .venv/bin/python -m benchmarks.soak --model DIR --duration 120    # the fast tier (CI runs it)

Owns the run: start ``triton-chat serve`` on the model and sample each of its processes idle
(``soak_memory``: the launcher with the frontend, tritonserver, each model stub: resident memory,
open files, threads), send ``soak_traffic``'s mix for a warm-up, let the server go idle and sample
again, send the mix for the duration in ``checkpoints`` segments with an idle sample after each
(and each process's peak resident memory under load, sampled every second), stop the server, and
print one JSON report: resident MiB per process at start, after the warm-up and at the end, its
growth per 10 minutes over the soak and over its second half (a leak keeps its slope, allocator
warm-up flattens), and a ``verdict`` with the soak's checks: no unexpected answer, resident
memory up by at most 5 % per process over the soak's second half (less the prefix cache, which
fills up to its own budget before it evicts; from the warm-up on when there are fewer than three
checkpoints: the model's kept heap fills to its cap over the first minutes of load, which is
warm-up, not a leak), open files and threads not growing (within ``COUNT_SLACK``), no
engine slot left taken when idle (the frontend's and the engine's gauges back to 0), the same
processes at the end (nothing restarted), and no shared-memory region or temporary folder left
once the server has stopped. Samples are taken idle so that requests in flight do not count as
growth.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from benchmarks import servers
from benchmarks.soak_memory import MIB, PeakRss, ProcessSample, RssTrend, sample_processes, served_processes, stub_names
from benchmarks.soak_traffic import Tally, run_traffic
from openai_frontend.launcher.local_http import http_call
from openai_frontend.launcher.triton_endpoints import Listener
from openai_frontend.launcher.tritonserver import SHM_DIR, SHM_PREFIX

logger = logging.getLogger("benchmarks.soak")

RSS_GROWTH_LIMIT = 0.05
# Open files and threads may differ by one or two between two idle moments: a connection the
# sampler just closed still holds a socket for a moment, pools start a thread on demand (asyncio's
# default executor). A leak per request or connection would add hundreds over thousands of requests.
COUNT_SLACK = 2
IDLE_TIMEOUT_S = 60.0
ENGINE_GAUGES = (
    "triton_chat_num_sequences_running",
    "triton_chat_num_requests_waiting",
    "triton_chat_kv_cache_reserved_tokens",
)
PREFIX_GAUGE = "triton_chat_prefix_cache_bytes"


@dataclass
class SoakReport:
    model: str
    concurrency: int
    warmup_s: float
    duration_s: float
    warmup: Tally
    soak: Tally
    after_warmup: dict[str, ProcessSample]
    at_end: dict[str, ProcessSample]
    idle_gauges: dict[str, float]  # frontend and engine gauges once idle after the soak
    leftovers: list[str]  # shm regions and temp folders left after the server stopped
    at_start: dict[str, ProcessSample] = field(default_factory=dict)  # idle, before any request
    # Resident MiB per process at each idle checkpoint, the first after the warm-up, the last
    # ``at_end``: a leak is a trend.
    rss_trend: RssTrend = field(default_factory=RssTrend)
    rss_mib_peak: dict[str, float] = field(default_factory=dict)  # under load, after the warm-up
    verdict: dict[str, bool] = field(default_factory=dict)

    def judge(self) -> None:
        same = self.after_warmup.keys() == self.at_end.keys() and all(
            self.after_warmup[name].pid == self.at_end[name].pid for name in self.at_end
        )
        self.verdict = {
            "no_unexpected_answers": self.warmup.failures == 0 and self.soak.failures == 0,
            "rss_growth_within_5_percent": same and all(v <= RSS_GROWTH_LIMIT for v in self.judged_growth().values()),
            "open_files_flat": same and self._flat(lambda sample: sample.open_files),
            "threads_flat": same and self._flat(lambda sample: sample.threads),
            "no_leaked_slots": all(value == 0 for value in self.idle_gauges.values()),
            "no_restarts": same,
            "no_leftovers": not self.leftovers,
        }

    def _flat(self, count: Callable[[ProcessSample], int]) -> bool:
        return all(count(self.at_end[n]) <= count(s) + COUNT_SLACK for n, s in self.after_warmup.items())

    def rss_growth(self) -> dict[str, float]:
        """Growth of resident memory after the warm-up, less what the prefix cache holds."""
        return {
            name: self.at_end[name].unaccounted_bytes / sample.unaccounted_bytes - 1
            for name, sample in self.after_warmup.items()
            if name in self.at_end
        }

    def judged_growth(self) -> dict[str, float]:
        """Growth over the second half of the checkpoints (a leak keeps growing there), or after
        the warm-up when there are too few checkpoints for a second half."""
        if len(self.rss_trend.times_s) < 3:
            return self.rss_growth()
        return self.rss_trend.growth(second_half=True)

    @property
    def passed(self) -> bool:
        return bool(self.verdict) and all(self.verdict.values())

    def rss_mib(self) -> dict[str, dict[str, float]]:
        """Resident MiB per process: idle at start, after the warm-up, at the end; peak under load."""
        points = {"start": self.at_start, "after_warmup": self.after_warmup, "end": self.at_end}
        table: dict[str, dict[str, float]] = {}
        for point, samples in points.items():
            for name, sample in samples.items():
                table.setdefault(name, {})[point] = round(sample.rss_bytes / MIB, 1)
        for name, peak in self.rss_mib_peak.items():
            table.setdefault(name, {})["peak_under_load"] = peak
        return table

    def to_json(self) -> str:
        body = asdict(self)
        body["rss_growth"] = {name: round(value, 4) for name, value in self.rss_growth().items()}
        body["rss_growth_second_half"] = {
            name: round(v, 4) for name, v in self.rss_trend.growth(second_half=True).items()
        }
        body["rss_mib"] = self.rss_mib()
        body["rss_mib_per_10min"] = self.rss_trend.per_10min()
        body["rss_mib_per_10min_second_half"] = self.rss_trend.per_10min(second_half=True)
        return json.dumps(body, indent=2)


def _sample(launcher_pid: int) -> dict[str, ProcessSample]:
    cache = int(_gauges(_triton_metrics(launcher_pid), (PREFIX_GAUGE,))[PREFIX_GAUGE])
    return sample_processes(launcher_pid, cache)


def _gauges(text: str, names: tuple[str, ...]) -> dict[str, float]:
    values = dict.fromkeys(names, 0.0)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in values:
                values[sample.name] += sample.value
    return values


def _triton_metrics_listener(launcher_pid: int) -> Listener:
    """Where tritonserver serves its metrics (TCP or its private Unix socket), from its command line."""
    args = served_processes(launcher_pid)["tritonserver"].cmdline()
    return Listener(args[args.index("--metrics-address") + 1], int(args[args.index("--metrics-port") + 1]))


def _triton_metrics(launcher_pid: int) -> str:
    """tritonserver's ``/metrics`` text."""
    return http_call(_triton_metrics_listener(launcher_pid), "/metrics", timeout=10).body.decode()


def _wait_idle(base_url: str, launcher_pid: int) -> dict[str, float]:
    """Poll until no request runs anywhere (bounded); the gauges as last read."""
    frontend = base_url.removesuffix("/v1") + "/metrics"
    deadline = time.monotonic() + IDLE_TIMEOUT_S
    while True:
        gauges = {
            **_gauges(httpx.get(frontend, timeout=10).text, ("num_requests_running",)),
            **_gauges(_triton_metrics(launcher_pid), ENGINE_GAUGES),
        }
        if not any(gauges.values()) or time.monotonic() > deadline:
            # The stub's gauges refresh every 0.2 s; the engine gives its kept heap back 1-1.5 s
            # after its last step (engine.IDLE_HOOK_DELAY_S): an idle server's memory is after that.
            time.sleep(2.5)
            return gauges
        time.sleep(0.5)


def _own_resources(launcher_pid: int) -> set[Path]:
    """The shared-memory regions and the temporary folder of this server alone.

    Another triton-chat on the same machine has its own, so only what this server's processes name
    (the stubs' regions in their argv, the run folder of tritonserver's model repository, the
    folder of its private sockets) counts.
    """
    processes = served_processes(launcher_pid)
    stubs = [processes[name] for name in stub_names(processes)]
    own = {SHM_DIR / arg for stub in stubs for arg in stub.cmdline() if arg.startswith(SHM_PREFIX)}
    args = processes["tritonserver"].cmdline()
    repository = Path(args[args.index("--model-repository") + 1])
    folders = [repository.parent]
    sockets = _triton_metrics_listener(launcher_pid).socket_path
    if sockets is not None:  # the folder of tritonserver's private sockets
        folders.append(Path(sockets).parent)
    temp = Path(tempfile.gettempdir())
    own.update(f for f in folders if f.name.startswith("triton-chat-") and f.parent == temp)
    return own


def run_soak(
    model_dir: str,
    dtype: str,
    duration_s: float,
    warmup_s: float,
    concurrency: int,
    log: Path,
    seed: int = 0,
    server_args: tuple[str, ...] = (),
    checkpoints: int = 1,
) -> SoakReport:
    """``checkpoints``: idle samples taken during the duration (evenly), the last at its end."""
    own: set[Path] = set()
    server = servers.ours(model_dir, dtype, log, max_num_seqs=concurrency, extra_args=server_args)
    server.start()
    trend = RssTrend()
    try:
        pid = server.pid
        own = _own_resources(pid)
        _wait_idle(server.base_url, pid)
        at_start = _sample(pid)
        warmup = asyncio.run(run_traffic(server.base_url, "bench", concurrency, warmup_s, seed))
        _wait_idle(server.base_url, pid)
        after_warmup = at_end = _sample(pid)
        started = time.monotonic()
        trend.add(0.0, after_warmup)
        soak = Tally()
        with PeakRss(pid) as peak:
            for segment in range(checkpoints):
                part = asyncio.run(
                    run_traffic(server.base_url, "bench", concurrency, duration_s / checkpoints, seed + 1 + segment)
                )
                soak.add(part)
                gauges = _wait_idle(server.base_url, pid)
                at_end = _sample(pid)
                own |= _own_resources(pid)
                trend.add(time.monotonic() - started, at_end)
                logger.info("checkpoint %d/%d: %s", segment + 1, checkpoints, {n: v[-1] for n, v in trend.mib.items()})
    finally:
        server.stop()
    leftovers = sorted(str(path) for path in own if path.exists())
    report = SoakReport(
        model_dir, concurrency, warmup_s, duration_s, warmup, soak, after_warmup, at_end, gauges, leftovers,
        at_start, trend, {name: round(value / MIB, 1) for name, value in peak.peaks.items()},
    )  # fmt: skip
    report.judge()
    return report


def main() -> None:
    parser = servers.served_model_parser(__doc__, "model folder")
    parser.add_argument("--duration", type=float, default=1200.0, help="seconds of load after the warm-up")
    parser.add_argument("--warmup", type=float, default=60.0, help="seconds of load before the first sample")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--checkpoints", type=int, default=10, help="idle samples during the duration")
    parser.add_argument("--log", type=Path, default=Path("benchmarks/results/soak-server.log"))
    parser.add_argument("server_args", nargs="*", help="more `triton-chat serve` flags (after --)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # not one line per request
    args.log.parent.mkdir(parents=True, exist_ok=True)
    report = run_soak(
        args.model,
        args.dtype,
        args.duration,
        args.warmup,
        args.concurrency,
        args.log,
        server_args=tuple(args.server_args),
        checkpoints=args.checkpoints,
    )
    sys.stdout.write(report.to_json() + "\n")
    sys.exit(0 if report.passed else 1)


if __name__ == "__main__":
    main()
