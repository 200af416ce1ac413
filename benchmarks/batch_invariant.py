"""What the batch-invariant mode costs: the engine in-process, distinct prompts, mode off and on.

For each mode and each concurrency, the same requests (``traffic.py``'s distinct mix: a unique
first line, then random words; output lengths forced with ``ignore_eos``) go to the engine with
at most C in flight, greedy. Prints one JSON line per run (output tokens/s, wall time) and, per
mode, how many answers differ between concurrency 1 and the largest one: the same prompt alone
and among others, which the mode makes zero.

    python -m benchmarks.batch_invariant --model ~/.cache/triton-chat/models/SmolLM2-135M-Instruct --dtype bfloat16
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from benchmarks.traffic import TrafficRequest, Workload, build_requests
from python_backend.engine.engine import Engine
from python_backend.engine.sequence import EngineEvent, EngineRequest
from python_backend.model.loader import load_model
from python_backend.model.threads import serialize_current_thread
from python_backend.prompt.chat_template import render_prompt
from python_backend.protocol.messages import validate_messages
from python_backend.protocol.params import parse_parameters
from python_backend.protocol.settings import EngineSettings


@dataclass(frozen=True)
class ModeRun:
    batch_invariant: bool
    concurrency: int
    requests: int
    output_tokens: int
    wall_s: float
    output_tokens_per_s: float


def run_mode(
    model: str, dtype: str, invariant: bool, concurrency: int, requests: list[TrafficRequest]
) -> tuple[ModeRun, list[str]]:
    """The requests through a fresh engine, at most ``concurrency`` at a time; the run and each answer."""
    threads = serialize_current_thread()  # only the engine thread runs torch in parallel, as served
    settings = EngineSettings(
        model_path=model,
        dtype=dtype,
        max_num_seqs=max(concurrency, 1),
        torch_threads=threads,
        batch_invariant=invariant,
    )
    loaded = load_model(settings)
    engine = Engine(loaded, settings)
    engine.start()
    slots, finished = threading.Semaphore(concurrency), threading.Semaphore(0)
    texts: dict[int, list[str]] = {}
    tokens = [0]
    lock = threading.Lock()

    def make(index: int, request: TrafficRequest) -> EngineRequest:
        def sink(event: EngineEvent) -> None:
            with lock:
                if event.delta is not None:
                    texts.setdefault(index, []).append(event.delta.text)
                    if event.delta.usage is not None:
                        tokens[0] += event.delta.usage.completion_tokens
            if event.final:
                slots.release()
                finished.release()

        raw = {"temperature": 0, "max_tokens": request.max_tokens, "ignore_eos": True}
        params = parse_parameters(raw, stream=True)
        prompt = render_prompt(
            loaded.tokenizer, validate_messages([{"role": "user", "content": request.prompt}]), params
        )
        return EngineRequest(f"bench-{index}", prompt, params, sink)

    try:
        slots.acquire()
        engine.submit(make(-1, TrafficRequest(None, "warm up", 8)))  # not timed
        finished.acquire()
        tokens[0] = 0
        started = time.perf_counter()
        for index, request in enumerate(requests):
            slots.acquire()
            engine.submit(make(index, request))
        for _ in requests:
            finished.acquire()
        wall = time.perf_counter() - started
    finally:
        engine.stop()
        torch.set_num_threads(threads)
    run = ModeRun(invariant, concurrency, len(requests), tokens[0], round(wall, 2), round(tokens[0] / wall, 1))
    return run, ["".join(texts.get(i, [])) for i in range(len(requests))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, type=lambda text: str(Path(text).expanduser()))
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    parser.add_argument("--concurrency", default="1,16", help="comma-separated C values")
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--input-len", type=int, default=256, help="prompt words (about tokens)")
    parser.add_argument("--input-range", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--output-range", type=int, default=64)
    parser.add_argument("--seed", type=int, default=17)
    args = parser.parse_args()
    workload = Workload("distinct", args.input_len, args.input_range, args.output_len, args.output_range, 0, args.seed)
    requests = build_requests(workload, args.requests)
    levels = [int(c) for c in args.concurrency.split(",")]
    for invariant in (False, True):
        answers = []
        for concurrency in levels:
            run, texts = run_mode(args.model, args.dtype, invariant, concurrency, requests)
            answers.append(texts)
            sys.stdout.write(json.dumps({"workload": asdict(workload), **asdict(run)}) + "\n")
            sys.stdout.flush()
        differ = sum(a != b for a, b in zip(answers[0], answers[-1], strict=True))
        summary = {
            "batch_invariant": invariant,
            "answers_differing_between_c": [levels[0], levels[-1]],
            "differ": differ,
        }
        sys.stdout.write(json.dumps({**summary, "of": len(requests)}) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
