"""Requests through a fresh engine in-process, at most C in flight: the benchmarks' common driver.

Owns ``run_engine``, ``EngineRun`` and the distinct workload's command-line arguments. No Triton and no HTTP: the figures are the engine's own, so
two engine settings compare without the serving path's noise. Greedy, outputs forced to their
length with ``ignore_eos``; one untimed warm-up request first. The process's C heap keeps what it
frees and the objects alive at start-up are frozen out of the collector, as in the served model.
"""

from __future__ import annotations

import argparse
import gc
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from itertools import pairwise

import torch

from benchmarks.traffic import TrafficRequest, add_workload_arguments
from python_backend.engine.engine import Engine
from python_backend.engine.request import EngineEvent, EngineRequest
from python_backend.intake.intake import Connection, Intake, chat_inputs
from python_backend.model.allocator import GlibcHeap, HeapKeeper, HeapPolicy, freeze_startup_objects, keep_freed_memory
from python_backend.model.loader import load_model
from python_backend.model.threads import serialize_current_thread
from python_backend.protocol.settings import EngineSettings


@dataclass
class EngineRun:
    concurrency: int
    requests: int
    output_tokens: int
    wall_s: float
    output_tokens_per_s: float
    ttft_ms_p50: float
    ttft_ms_p99: float
    itl_ms_p50: float  # over every gap between a request's text deltas
    itl_ms_p99: float
    # Per request, (last delta - first delta) / (tokens - 1): the time per output token, which
    # counts every token of a speculative step (ITL counts the step once).
    tpot_ms_p50: float
    answers: list[str] = field(repr=False)
    # Per request, in the order given (0: fewer than 2 tokens).
    tpot_ms: list[float] = field(default_factory=list, repr=False)


def add_in_process_workload_arguments(parser: argparse.ArgumentParser, output_range: int = 64) -> None:
    """``traffic.py``'s workload flags as every in-process benchmark takes them (its own seed)."""
    add_workload_arguments(parser, seed=17, output_range=output_range)


def _percentile(values: list[float], share: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


def run_engine(
    settings: EngineSettings,
    requests: list[TrafficRequest],
    concurrency: int,
    on_started: Callable[[], None] | None = None,
    before_each: Callable[[int], None] | None = None,
) -> EngineRun:
    """``requests`` through a fresh engine loaded with ``settings``, at most ``concurrency`` in flight;
    ``on_started`` is called when the timed part begins (after the load and the warm-up request);
    ``before_each(index)`` before a request is submitted, once it has a slot (at concurrency 1: with
    the engine idle), and the time it takes is not counted in the wall time."""
    threads = serialize_current_thread()  # only the engine thread runs torch in parallel, as served
    if not settings.torch_threads:
        settings = replace(settings, torch_threads=threads)
    loaded = load_model(settings)
    intake = Intake.for_model(loaded, settings)
    # The heap policy the served model runs with, its cap and its idle give-back (triton/model.py).
    policy = HeapPolicy.capped_mb(settings.cpu_keep_freed_memory_mb)
    keeps = loaded.device.type == "cpu" and settings.cpu_keep_freed_memory and keep_freed_memory(policy)
    heap = HeapKeeper(policy.keep_cap, GlibcHeap()) if keeps else None
    if heap is None:
        engine = Engine(loaded, settings)
    else:
        engine = Engine(loaded, settings, after_pass=heap.after_pass, on_idle=heap.release)
    engine.start()
    freeze_startup_objects()  # as served; given back below
    slots, finished = threading.Semaphore(concurrency), threading.Semaphore(0)
    texts: dict[int, list[str]] = {}
    stamps: dict[int, list[float]] = {}
    submitted: dict[int, float] = {}
    tokens = [0]
    per_request: dict[int, int] = {}
    lock = threading.Lock()

    def make(index: int, request: TrafficRequest) -> EngineRequest:
        def sink(event: EngineEvent) -> None:
            now = time.perf_counter()
            with lock:
                if event.delta is not None:
                    if event.delta.text:
                        texts.setdefault(index, []).append(event.delta.text)
                        stamps.setdefault(index, []).append(now)
                    if event.delta.usage is not None:
                        tokens[0] += event.delta.usage.completion_tokens
                        per_request[index] = event.delta.usage.completion_tokens
            if event.final:
                slots.release()
                finished.release()

        raw = {"temperature": 0, "max_tokens": request.max_tokens, "ignore_eos": True}
        messages = [{"role": "user", "content": request.prompt}]
        return intake.from_inputs(f"bench-{index}", chat_inputs(messages, raw), Connection(sink))

    try:
        slots.acquire()
        engine.submit(make(-1, TrafficRequest(None, "warm up", 8)))  # not timed
        finished.acquire()
        tokens[0] = 0
        if on_started is not None:
            on_started()
        started, paused = time.perf_counter(), 0.0
        for index, request in enumerate(requests):
            slots.acquire()
            if before_each is not None:
                pause = time.perf_counter()
                before_each(index)
                paused += time.perf_counter() - pause
            submitted[index] = time.perf_counter()
            engine.submit(make(index, request))
        for _ in requests:
            finished.acquire()
        wall = time.perf_counter() - started - paused
    finally:
        engine.stop()
        gc.unfreeze()
        torch.set_num_threads(threads)
    ttft = [(stamps[i][0] - submitted[i]) * 1e3 for i in submitted if stamps.get(i)]
    itl = [(b - a) * 1e3 for i in submitted for a, b in pairwise(stamps.get(i, []))]
    per_token = {
        i: (stamps[i][-1] - stamps[i][0]) * 1e3 / (per_request[i] - 1)
        for i in submitted
        if len(stamps.get(i, [])) > 1 and per_request.get(i, 0) > 1
    }
    tpot = list(per_token.values())
    return EngineRun(
        concurrency=concurrency,
        requests=len(requests),
        output_tokens=tokens[0],
        wall_s=round(wall, 2),
        output_tokens_per_s=round(tokens[0] / wall, 1),
        ttft_ms_p50=round(_percentile(ttft, 0.5)),
        ttft_ms_p99=round(_percentile(ttft, 0.99)),
        itl_ms_p50=round(_percentile(itl, 0.5), 1),
        itl_ms_p99=round(_percentile(itl, 0.99), 1),
        tpot_ms_p50=round(_percentile(tpot, 0.5), 2),
        answers=["".join(texts.get(i, [])) for i in range(len(requests))],
        tpot_ms=[round(per_token.get(i, 0.0), 3) for i in range(len(requests))],
    )
