"""In-process references: plain transformers ``generate`` and our engine without any serving path.

Both run the same chat prompt for the same number of tokens, so their tokens/s compare directly
with the served figures of ``load.py``.

    python benchmarks/inprocess.py --model DIR --dtype bfloat16 --max-tokens 64
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from dataclasses import asdict, dataclass

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from benchmarks.load import DEFAULT_PROMPT
from python_backend.engine.engine import Engine
from python_backend.engine.request import EngineEvent, EngineRequest
from python_backend.intake.intake import Connection, Intake, chat_inputs
from python_backend.model.loader import load_model
from python_backend.model.threads import serialize_current_thread
from python_backend.protocol.settings import EngineSettings

_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


@dataclass
class InProcessResult:
    label: str
    batch_or_concurrency: int
    requests: int
    tokens: int
    wall_s: float
    tokens_per_s: float


def hf_generate(model_dir: str, dtype: str, batch: int, max_tokens: int, repeats: int = 2) -> InProcessResult:
    """Static batch: ``batch`` copies of the prompt in one ``generate`` call, every one to max_tokens."""
    tokenizer = AutoTokenizer.from_pretrained(model_dir, padding_side="left")
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=_DTYPES[dtype]).eval()
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": DEFAULT_PROMPT}], add_generation_prompt=True, tokenize=False
    )
    inputs = tokenizer([text] * batch, return_tensors="pt", add_special_tokens=False, padding=True)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    kwargs = dict(max_new_tokens=max_tokens, min_new_tokens=max_tokens, do_sample=False, pad_token_id=pad)
    with torch.inference_mode():
        model.generate(**inputs, **{**kwargs, "max_new_tokens": 4, "min_new_tokens": 4})  # warm-up
        started = time.perf_counter()
        for _ in range(repeats):
            model.generate(**inputs, **kwargs)
        wall = time.perf_counter() - started
    tokens = batch * max_tokens * repeats
    return InProcessResult(
        f"hf-generate-bs{batch}", batch, batch * repeats, tokens, round(wall, 3), round(tokens / wall, 2)
    )


def engine_inprocess(
    model_dir: str,
    dtype: str,
    concurrency: int,
    requests: int,
    max_tokens: int,
    stream_interval: int = 1,
) -> InProcessResult:
    """Our engine called directly: ``requests`` chat requests, at most ``concurrency`` in flight.

    ``stream_interval`` is the served path's ``--stream-interval`` in comparisons with it: the
    engine then builds as many deltas in-process as it does served. Every request's parameters
    are parsed, its messages checked and its chat template applied and tokenized in the submitting
    thread, as the Triton model does for each request beside the engine thread (0.2 ms each here).
    """
    # As in the Triton model: only the engine thread runs torch in parallel (model/threads.py).
    # The caller's count is restored afterwards for the generate() references that run here.
    threads = serialize_current_thread()
    settings = EngineSettings(
        model_path=model_dir,
        dtype=dtype,
        max_num_seqs=max(concurrency, 1),
        torch_threads=threads,
        stream_interval=stream_interval,
    )
    loaded = load_model(settings)
    engine = Engine(loaded, settings)
    engine.start()
    try:
        tokens, wall = timed_chat_requests(
            engine, Intake.for_model(loaded, settings), "bench", requests, concurrency, max_tokens
        )
    finally:
        engine.stop()
        torch.set_num_threads(threads)
    return InProcessResult(
        f"engine-c{concurrency}", concurrency, requests, tokens, round(wall, 3), round(tokens / wall, 2)
    )


def timed_chat_requests(
    engine: Engine, intake: Intake, prefix: str, requests: int, concurrency: int, max_tokens: int
) -> tuple[int, float]:
    """Completion tokens and wall seconds of ``requests`` greedy chat requests of ``max_tokens``
    tokens each, at most ``concurrency`` in flight, after one untimed warm-up request.

    Each request enters through the intake, as the Triton model's do (parameters parsed, messages
    checked, chat template applied and tokenized in the submitting thread).
    """
    raw_params = {"temperature": 0, "max_tokens": max_tokens, "ignore_eos": True}
    raw_messages = [{"role": "user", "content": DEFAULT_PROMPT}]
    slots = threading.Semaphore(concurrency)
    finished = threading.Semaphore(0)
    tokens = [0]
    lock = threading.Lock()

    def make(i: int) -> EngineRequest:
        def sink(event: EngineEvent) -> None:
            if event.delta is not None and event.delta.usage is not None:
                with lock:
                    tokens[0] += event.delta.usage.completion_tokens
            if event.final:
                slots.release()
                finished.release()

        return intake.from_inputs(f"{prefix}-{i}", chat_inputs(raw_messages, dict(raw_params)), Connection(sink))

    slots.acquire()
    engine.submit(make(-1))  # warm-up, not timed
    finished.acquire()
    tokens[0] = 0
    started = time.perf_counter()
    for i in range(requests):
        slots.acquire()
        engine.submit(make(i))
    for _ in range(requests):
        finished.acquire()
    return tokens[0], time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True)
    parser.add_argument("--dtype", default="bfloat16", choices=sorted(_DTYPES))
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--which", default="hf1,hf16,engine1,engine16")
    args = parser.parse_args()
    runs = {
        "hf1": lambda: hf_generate(args.model, args.dtype, 1, args.max_tokens),
        "hf16": lambda: hf_generate(args.model, args.dtype, 16, args.max_tokens),
        "engine1": lambda: engine_inprocess(args.model, args.dtype, 1, 4, args.max_tokens),
        "engine4": lambda: engine_inprocess(args.model, args.dtype, 4, 8, args.max_tokens),
        "engine16": lambda: engine_inprocess(args.model, args.dtype, 16, 32, args.max_tokens),
    }
    for name in args.which.split(","):
        sys.stdout.write(json.dumps(asdict(runs[name]())) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
