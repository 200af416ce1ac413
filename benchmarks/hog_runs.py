"""The load alone, beside busy processes, then alone again: ``alone_beside_again`` and its ratios.

Owns ``alone_beside_again`` (the three runs, each on prompts of its own, the third timed from the
moment the neighbours ended), ``HogRuns`` (its reports) and ``HogRatios`` (beside and again ÷ alone,
and whether each target holds). The busy processes, the targets and ``recovery_s`` are
``cpu_hog``'s; a run is whatever ``LoadRunner`` the caller binds (``benchmarks.traffic``'s
``run_traffic``). Imports ``cpu_hog`` and, for its types only, ``traffic``: ``traffic``'s command
line runs this module, so importing it back at run time would be a cycle.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Protocol

from benchmarks.cpu_hog import (
    BESIDE_MAX_TTFT_P99_RATIO,
    BESIDE_MIN_RATIO,
    RECOVERY_LEVEL,
    RECOVERY_LIMIT_S,
    RECOVERY_WINDOW_S,
    Arrival,
    CpuHog,
    recovery_s,
)

if TYPE_CHECKING:
    from benchmarks.traffic import TrafficReport, Workload


@dataclass(frozen=True)
class HogRatios:
    """One load alone, beside busy processes, and alone again from the moment they ended: the
    figures beside and again ÷ the first run alone, and whether each target holds."""

    label: str
    arrivals: str
    hog: int
    output_tokens_per_s_alone: float
    output_tokens_per_s_beside: float
    output_tokens_per_s_again: float
    throughput_ratio: float  # output tok/s beside ÷ alone
    ttft_p99_ratio: float
    itl_p99_ratio: float
    again_over_alone: float  # output tok/s of the run alone again ÷ the first run's
    recovery_s: float | None  # after the neighbours ended, see ``recovery_s``
    throughput_target_met: bool
    ttft_target_met: bool
    recovery_target_met: bool
    targets: str = (
        f"beside/alone output tok/s >= {BESIDE_MIN_RATIO}, TTFT p99 beside/alone <= {BESIDE_MAX_TTFT_P99_RATIO}, "
        f"{RECOVERY_LEVEL}x alone output tok/s over {RECOVERY_WINDOW_S:g} s within {RECOVERY_LIMIT_S:g} s "
        "after the neighbours ended"
    )


def _ratio(beside: float, alone: float) -> float:
    return round(beside / alone, 3) if alone > 0 else 0.0


def hog_ratios(
    alone: TrafficReport, beside: TrafficReport, again: TrafficReport, recovered_s: float | None
) -> HogRatios:
    throughput = _ratio(beside.output_tokens_per_s, alone.output_tokens_per_s)
    ttft = _ratio(beside.ttft_p99_ms, alone.ttft_p99_ms)
    return HogRatios(
        label=alone.label,
        arrivals=alone.arrivals,
        hog=beside.hog,
        output_tokens_per_s_alone=alone.output_tokens_per_s,
        output_tokens_per_s_beside=beside.output_tokens_per_s,
        output_tokens_per_s_again=again.output_tokens_per_s,
        throughput_ratio=throughput,
        ttft_p99_ratio=ttft,
        itl_p99_ratio=_ratio(beside.itl_p99_ms, alone.itl_p99_ms),
        again_over_alone=_ratio(again.output_tokens_per_s, alone.output_tokens_per_s),
        recovery_s=recovered_s,
        throughput_target_met=throughput >= BESIDE_MIN_RATIO,
        ttft_target_met=alone.ttft_p99_ms > 0 and ttft <= BESIDE_MAX_TTFT_P99_RATIO,
        recovery_target_met=recovered_s is not None and recovered_s <= RECOVERY_LIMIT_S,
    )


class LoadRunner(Protocol):
    """Runs one load and reports it (``run_traffic`` with the rest of its arguments bound)."""

    def __call__(self, load: Workload, *, warmup: bool = True, arrivals: list[Arrival] | None = None) -> TrafficReport:
        """``warmup`` and ``arrivals`` as ``run_traffic`` takes them."""
        ...


@dataclass(frozen=True)
class HogRuns:
    """The three runs of ``alone_beside_again`` and their ratios."""

    alone: TrafficReport
    beside: TrafficReport
    again: TrafficReport
    ratios: HogRatios


def alone_beside_again(
    run: LoadRunner, workload: Workload, hog: int, limit_s: float, clock: Callable[[], float] = time.perf_counter
) -> HogRuns:
    """``run`` alone; beside ``hog`` busy processes (which end with the run, or after ``limit_s`` at
    the latest); then alone again from the moment they have ended, without a warm-up request, its
    arrivals timed from that moment (``clock``, the clock of ``Arrival.at_s``). Each run has prompts
    of its own of the same lengths."""
    alone = run(workload)
    with CpuHog(hog, limit_s):
        beside = replace(run(replace(workload, variant=workload.variant + 1)), hog=hog)
    ended = clock()
    arrivals: list[Arrival] = []
    again = replace(
        run(replace(workload, variant=workload.variant + 2), warmup=False, arrivals=arrivals), after_hog=hog
    )
    recovered = recovery_s(arrivals, ended, RECOVERY_LEVEL * alone.output_tokens_per_s)
    return HogRuns(alone, beside, again, hog_ratios(alone, beside, again, recovered))
