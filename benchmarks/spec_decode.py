"""Speculative decoding's speed-up: the engine with drafts against without.

Runs the same requests through the engine in-process (one at a time, or ``--concurrency C`` in
flight), without drafts and with
``--tokens`` drafts a step (n-gram prompt lookup, or with ``--draft-model DIR`` a draft model's),
on two workloads:

- ``repetitive``: answers that copy their prompt (quote a passage, edit code and return it whole,
  change one value of a config file): where prompt-lookup drafts are accepted;
- ``distinct``: the traffic benchmark's distinct prompts (random words; outputs forced to their
  length with ``ignore_eos`` + ``min_tokens``), where they mostly are not.

Prints one JSON line per workload and mode (output tokens/s, and with drafts the acceptance rate
and accepted drafts per verify step), then one per workload with the speed-up and whether every greedy
answer was identical with and without drafts.

    python -m benchmarks.spec_decode --model ~/.cache/triton-chat/models/SmolLM2-135M-Instruct --dtype float32

``--draft-model`` takes any local folder with the model's tokenizer; the figures in
docs/performance.md say which draft they used.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

from benchmarks.traffic import Workload, build_requests
from python_backend.engine.engine import Engine
from python_backend.engine.request import EngineEvent, EngineRequest
from python_backend.intake.intake import Connection, Intake, chat_inputs
from python_backend.model.draft import load_draft
from python_backend.model.loader import LoadedModel, load_model
from python_backend.model.threads import serialize_current_thread
from python_backend.protocol.settings import EngineSettings

_CODE = """def summarize(orders):
    total = 0
    count = 0
    for order in orders:
        if order.status == "paid":
            total += order.amount
            count += 1
    average = total / count if count else 0
    return {"total": total, "count": count, "average": average}
"""
_LICENCE = (
    "Permission is hereby granted, free of charge, to any person obtaining a copy of this software "
    "and associated documentation files, to deal in the Software without restriction, including "
    "without limitation the rights to use, copy, modify, merge, publish, distribute, sublicense, "
    "and/or sell copies of the Software, subject to the following conditions: the above copyright "
    "notice and this permission notice shall be included in all copies or substantial portions of "
    "the Software."
)
_CONFIG = """server:
  host: 0.0.0.0
  port: 8080
  workers: 4
logging:
  level: info
  file: /var/log/app.log
database:
  url: postgres://db.internal:5432/app
  pool_size: 10
"""
REPETITIVE = [
    f"Rename the variable `total` to `paid_total` in this function and return the whole function:\n\n{_CODE}",
    f"Quote the following paragraph exactly, word for word:\n\n{_LICENCE}",
    f"Change the port to 9090 in this configuration file and return the whole file:\n\n{_CONFIG}",
    f"Add a docstring to this function and return the whole function:\n\n{_CODE}",
]


@dataclass(frozen=True)
class Prompt:
    text: str
    max_tokens: int
    forced: bool  # output length forced with ignore_eos + min_tokens


@dataclass
class RunResult:
    workload: str
    mode: str  # "off", "ngram-K" or "draft-K"
    concurrency: int
    requests: int
    tokens: int
    wall_s: float
    tokens_per_s: float
    draft_tokens: int = 0
    accepted_tokens: int = 0
    verify_steps: int = 0
    acceptance_rate: float = 0.0


def prompts_for(workload: str, count: int, max_tokens: int) -> list[Prompt]:
    if workload == "repetitive":
        return [Prompt(REPETITIVE[i % len(REPETITIVE)], max_tokens, False) for i in range(count)]
    traffic = Workload("distinct", 256, 128, max_tokens, max_tokens // 2, 0, seed=17)
    return [Prompt(r.prompt, r.max_tokens, True) for r in build_requests(traffic, count)]


@dataclass
class Answer:
    text: str = ""
    tokens: int = 0  # completion tokens, from the usage


def _request(
    intake: Intake,
    name: str,
    prompt: Prompt,
    done: threading.Event,
    out: Answer,
    slot: threading.Semaphore | None = None,
) -> EngineRequest:
    raw: dict[str, object] = {"temperature": 0, "max_tokens": prompt.max_tokens}
    if prompt.forced:
        raw.update(ignore_eos=True, min_tokens=prompt.max_tokens)

    def sink(event: EngineEvent) -> None:
        if event.delta is not None:
            out.text += event.delta.text
            if event.delta.usage is not None:
                out.tokens = event.delta.usage.completion_tokens
        if event.final:
            done.set()
            if slot is not None:
                slot.release()

    return intake.from_inputs(name, chat_inputs([{"role": "user", "content": prompt.text}], raw), Connection(sink))


def run(
    loaded: LoadedModel, settings: EngineSettings, workload: str, prompts: list[Prompt], concurrency: int = 1
) -> tuple[RunResult, list[str]]:
    """The prompts, ``concurrency`` in flight at a time (closed loop), after one warm-up request;
    the answers' texts in prompt order."""
    engine = Engine(loaded, settings)
    intake = Intake.for_model(loaded, settings)
    engine.start()
    answers = [Answer() for _ in prompts]
    finished = [threading.Event() for _ in prompts]
    try:
        warm = threading.Event()
        engine.submit(_request(intake, "warm-up", prompts[0], warm, Answer()))
        warm.wait()
        before = engine.stats()
        started = time.perf_counter()
        # A request goes in as soon as one in flight has finished: C in flight until the tail.
        slots = threading.Semaphore(concurrency)
        for i, prompt in enumerate(prompts):
            if not slots.acquire(timeout=600):
                raise TimeoutError(f"no request finished in 600 s before request {i}")
            engine.submit(_request(intake, f"bench-{i}", prompt, finished[i], answers[i], slots))
        for i, done in enumerate(finished):
            if not done.wait(600):
                raise TimeoutError(f"request {i} did not finish in 600 s")
        wall = time.perf_counter() - started
        after = engine.stats()
    finally:
        engine.stop()
    texts = [answer.text for answer in answers]
    tokens = sum(answer.tokens for answer in answers)
    drafted = after.spec_decode_num_draft_tokens - before.spec_decode_num_draft_tokens
    accepted = after.spec_decode_num_accepted_tokens - before.spec_decode_num_accepted_tokens
    if loaded.draft is not None:
        mode = f"draft-{settings.speculative_model_tokens}"
    else:
        mode = f"ngram-{settings.speculative_ngram_tokens}" if settings.speculative_ngram_tokens else "off"
    result = RunResult(
        workload, mode, concurrency, len(prompts), tokens, round(wall, 3), round(tokens / wall, 2), drafted, accepted,
        after.spec_decode_num_steps - before.spec_decode_num_steps, round(accepted / drafted, 3) if drafted else 0.0,
    )  # fmt: skip
    return result, texts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, type=Path)
    parser.add_argument("--dtype", default="float32", choices=("bfloat16", "float32"))
    parser.add_argument("--tokens", type=int, default=4, help="draft tokens per step (default 4)")
    parser.add_argument("--requests", type=int, default=8, help="requests per workload and mode")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--workloads", default="repetitive,distinct")
    parser.add_argument("--concurrency", type=int, default=1, help="requests in flight (closed loop; default 1)")
    parser.add_argument(
        "--disable-by-batch-size", type=int, default=0, metavar="N",
        help="plain steps while more than N sequences run (speculative_disable_by_batch_size; default 0 = never)",
    )  # fmt: skip
    parser.add_argument("--draft-model", type=Path, help="a draft model's folder: draft-model instead of n-gram drafts")
    args = parser.parse_args()
    # As in the Triton model: only the engine thread runs torch in parallel (model/threads.py).
    threads = serialize_current_thread()
    base = EngineSettings(model_path=str(args.model.expanduser()), dtype=args.dtype, torch_threads=threads)
    loaded = load_model(base)
    speculating = replace(base, speculative_disable_by_batch_size=args.disable_by_batch_size)
    if args.draft_model is not None:
        draft = load_draft(str(args.draft_model.expanduser()), loaded.tokenizer, loaded.device, loaded.dtype, False)
        on_settings = replace(
            speculating, speculative_model=str(args.draft_model), speculative_model_tokens=args.tokens
        )
        modes = [(loaded, base), (replace(loaded, draft=draft), on_settings)]
    else:
        modes = [(loaded, base), (loaded, replace(speculating, speculative_ngram_tokens=args.tokens))]
    try:
        for workload in args.workloads.split(","):
            prompts = prompts_for(workload, args.requests, args.max_tokens)
            (off, off_texts), (on, on_texts) = (
                run(model, settings, workload, prompts, args.concurrency) for model, settings in modes
            )
            for result in (off, on):
                sys.stdout.write(json.dumps(asdict(result)) + "\n")
            summary = {
                "workload": workload,
                "speedup": round(on.tokens_per_s / off.tokens_per_s, 3),
                "acceptance_rate": on.acceptance_rate,
                # Summed over the step's rows: a row's own tokens per step only at concurrency 1.
                "accepted_per_verify_step": round(on.accepted_tokens / on.verify_steps, 2) if on.verify_steps else 0,
                "identical_answers": on_texts == off_texts,
            }
            sys.stdout.write(json.dumps(summary) + "\n")
            sys.stdout.flush()
    finally:
        torch.set_num_threads(threads)


if __name__ == "__main__":
    main()
