"""What a mode costs in quality against the 16-bit model: greedy agreement and perplexity, in-process.

Each ``--variant NAME:key=value,...`` is a set of engine settings over the common ``--model`` /
``--dtype`` (``engine_ab.py``'s form: config.pbtxt names, as ``EngineSettings.from_parameters``
reads them); the first is the reference, normally the 16-bit model as it is (``bf16:``). A
quantized checkpoint of the same model is a mode too: ``w8a8:model_path=DIR`` (it must share the
``--model``'s tokenizer, which tokenizes the text). Each mode runs on a fresh engine, its
requests built by the intake as a served request's are:

- greedy agreement: ``--prompts`` distinct chat prompts (a task and a topic each), greedy, up to
  ``--max-tokens`` tokens (an answer may end at the end-of-sequence token, as served). Per mode:
  the share of answers whose token ids are the reference's, and for the others the position of
  the first token that differs (mean and median; a prefix of the other answer differs where the
  shorter one ends).
- perplexity on the held-out text in ``benchmarks/data/`` (``--text``), teacher-forced through
  the engine's prefill: the text's tokens go in ``--window``-token windows, ``--stride`` apart,
  each asking for ``prompt_logprobs``; a window scores only the tokens after the previous window's
  end, so each token but the first is scored once, with at least ``window - stride`` before it.
  ``--text-tokens`` caps the tokens read, and ``--deadline`` bounds each mode's whole run.

Requests go ``-c`` at a time (default 1: each prompt alone, so a mode compared with itself agrees
on every answer; with more in flight, batch composition can change a greedy choice that was a tie
to within rounding). Prints one JSON line per mode, then a Markdown table.

    python -m benchmarks.quality --model ~/.cache/triton-chat/models/SmolLM2-135M-Instruct \\
        --dtype bfloat16 --variant bf16: --variant int8:quantization=int8 --variant w8a8:model_path=W8A8_DIR
    python -m benchmarks.quality --model ~/.cache/triton-chat/models/SmolLM2-135M-Instruct \\
        --dtype float32 --variant f32: --variant bf16kv:kv_cache_dtype=bfloat16
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import random
import statistics
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
import torch
from transformers import AutoTokenizer, PreTrainedTokenizerBase

from benchmarks.engine_ab import Variant, parse_variant, variant_settings
from benchmarks.traffic import WORDS
from python_backend.engine.engine import Engine
from python_backend.engine.request import EngineEvent
from python_backend.intake.intake import Connection, Intake, chat_inputs
from python_backend.model.loader import load_model
from python_backend.model.threads import serialize_current_thread
from python_backend.protocol import contract
from python_backend.protocol.settings import EngineSettings, SettingsError

DEFAULT_TEXT = Path(__file__).resolve().parent / "data" / "held_out.txt"
_TASKS = (
    "Explain in two sentences what a {} is.",
    "Write a short story about a {}.",
    "List three facts about the word '{}'.",
    "Describe a {} to a child.",
    "Give one reason why a {} matters to people.",
    "Write a haiku about a {}.",
    "What is the opposite of a {}? Answer briefly.",
    "Use the word '{}' in three different sentences.",
)


@dataclass(frozen=True)
class Window:
    """Tokens ``[start, end)`` of the text go in; those from ``scored_from`` on are scored."""

    start: int
    end: int
    scored_from: int


@dataclass(frozen=True)
class Agreement:
    prompts: int
    identical: int
    share_identical: float
    first_divergence_mean: float | None  # over the answers that differ; None when none does
    first_divergence_median: float | None


@dataclass
class ModeRun:
    """What one mode answered: each prompt's greedy token ids and each scored token's log-probability."""

    answers: list[list[int]]
    logprobs: list[float]
    wall_s: float


def agreement_prompts(count: int, seed: int = 3) -> list[str]:
    """``count`` distinct chat prompts, a task about a topic word each, the same for every mode."""
    pairs = [task.format(word) for word in WORDS for task in _TASKS]
    if count > len(pairs):
        raise ValueError(f"at most {len(pairs)} distinct prompts, asked for {count}")
    return random.Random(seed).sample(pairs, count)


def first_divergence(reference: Sequence[int], other: Sequence[int]) -> int | None:
    """The index of the first token where the answers differ; None when they are the same."""
    for index, (a, b) in enumerate(zip(reference, other, strict=False)):
        if a != b:
            return index
    return None if len(reference) == len(other) else min(len(reference), len(other))


def agreement(reference: Sequence[Sequence[int]], other: Sequence[Sequence[int]]) -> Agreement:
    """How far ``other``'s answers follow the reference's, prompt by prompt."""
    if len(reference) != len(other) or not reference:
        raise ValueError(f"compare answers to the same prompts: {len(reference)} and {len(other)}")
    divergences = [d for a, b in zip(reference, other, strict=True) if (d := first_divergence(a, b)) is not None]
    identical = len(reference) - len(divergences)
    return Agreement(
        prompts=len(reference),
        identical=identical,
        share_identical=round(identical / len(reference), 4),
        first_divergence_mean=round(statistics.fmean(divergences), 2) if divergences else None,
        first_divergence_median=float(statistics.median(divergences)) if divergences else None,
    )


def perplexity(logprobs: Sequence[float]) -> float:
    """exp of the mean negative log-probability (natural log) of the scored tokens."""
    if not logprobs:
        raise ValueError("perplexity needs at least one scored token")
    return math.exp(-math.fsum(logprobs) / len(logprobs))


def windows(tokens: int, window: int, stride: int) -> list[Window]:
    """Windows over ``tokens`` tokens scoring each token but the first exactly once (see the module doc)."""
    if not 1 <= stride < window:
        raise ValueError(f"need 1 <= stride < window, got window {window}, stride {stride}")
    spans: list[Window] = []
    scored_until = 1  # the text's first token has nothing before it
    while scored_until < tokens:
        start = max(0, scored_until - (window - stride))
        end = min(start + window, tokens)
        spans.append(Window(start, end, scored_until))
        scored_until = end
    return spans


def text_token_ids(tokenizer: PreTrainedTokenizerBase, text: str, limit: int) -> list[int]:
    """The text's token ids (no special tokens), at most ``limit`` of them."""
    ids = tokenizer.encode(text, add_special_tokens=False)
    return [int(i) for i in ids[:limit]]


class _Collector:
    """The events of one request: its generated token ids, prompt scores and error."""

    def __init__(self) -> None:
        self.token_ids: list[int] = []
        self.prompt_scores: list[float | None] = []
        self.error: str | None = None
        self.done = threading.Event()

    def __call__(self, event: EngineEvent) -> None:
        delta = event.delta
        if delta is not None:
            self.token_ids.extend(item.token_id for item in delta.logprobs or ())
            if delta.prompt_logprobs is not None:
                self.prompt_scores = [position.logprob for position in delta.prompt_logprobs]
        if event.error is not None:
            self.error = f"{event.error.code}: {event.error.message}"
        if event.final:
            self.done.set()


def run_mode(
    settings: EngineSettings,
    prompts: list[str],
    max_tokens: int,
    text_ids: list[int],
    spans: list[Window],
    concurrency: int,
    deadline_s: float,
) -> ModeRun:
    """The prompts' greedy answers and the text's scores from a fresh engine loaded with ``settings``."""
    threads = serialize_current_thread()  # only the engine thread runs torch in parallel, as served
    if not settings.torch_threads:
        settings = replace(settings, torch_threads=threads)
    loaded = load_model(settings)
    intake = Intake.for_model(loaded, settings)
    engine = Engine(loaded, settings)
    engine.start()
    started = time.perf_counter()
    deadline = started + deadline_s
    slots = threading.Semaphore(concurrency)

    def send(index: int, inputs: dict[str, np.ndarray]) -> _Collector:
        collector = _Collector()

        def sink(event: EngineEvent) -> None:
            collector(event)
            if event.final:
                slots.release()

        if not slots.acquire(timeout=max(0.0, deadline - time.perf_counter())):
            raise TimeoutError(f"the mode did not finish within --deadline {deadline_s:g} s")
        engine.submit(intake.from_inputs(f"quality-{index}", inputs, Connection(sink)))
        return collector

    def wait(collectors: list[_Collector]) -> None:
        for collector in collectors:
            if not collector.done.wait(max(0.0, deadline - time.perf_counter())):
                raise TimeoutError(f"the mode did not finish within --deadline {deadline_s:g} s")
            if collector.error is not None:
                raise RuntimeError(f"a request failed: {collector.error}")

    try:
        params = {"temperature": 0, "max_tokens": max_tokens, "logprobs": True}
        answers = [
            send(i, chat_inputs([{"role": "user", "content": prompt}], dict(params), stream=False))
            for i, prompt in enumerate(prompts)
        ]
        scores = [send(len(prompts) + i, _window_inputs(text_ids[w.start : w.end])) for i, w in enumerate(spans)]
        wait(answers + scores)
        wall = time.perf_counter() - started
    finally:
        engine.stop()
        intake.close()
        torch.set_num_threads(threads)
    logprobs: list[float] = []
    for span, collector in zip(spans, scores, strict=True):
        window_scores = collector.prompt_scores[span.scored_from - span.start :]
        if len(window_scores) != span.end - span.scored_from or any(s is None for s in window_scores):
            raise RuntimeError(f"window {span}: expected {span.end - span.scored_from} prompt scores")
        logprobs.extend(s for s in window_scores if s is not None)
    return ModeRun([c.token_ids for c in answers], logprobs, round(wall, 2))


def _window_inputs(ids: list[int]) -> dict[str, np.ndarray]:
    params = {"temperature": 0, "max_tokens": 1, "prompt_logprobs": 0}
    return {
        contract.PROMPT_TOKEN_IDS: np.array(ids, dtype=np.int32),
        contract.PARAMETERS: contract.json_tensor(params),
        contract.STREAM: contract.bool_tensor(False),
    }


@dataclass(frozen=True)
class ModeRecord:
    """One mode's JSON line: its agreement with the reference and its perplexity beside the reference's."""

    mode: str
    settings: dict[str, str]
    agreement: Agreement
    answer_tokens_mean: float
    perplexity: float
    reference_perplexity: float
    scored_tokens: int
    windows: int
    wall_s: float

    def line(self) -> dict[str, object]:
        record = asdict(self)
        shares = record.pop("agreement")
        return {**record, **shares}


def mode_record(variant: Variant, run: ModeRun, reference: ModeRun, spans: list[Window]) -> ModeRecord:
    return ModeRecord(
        mode=variant.name,
        settings=variant.parameters,
        agreement=agreement(reference.answers, run.answers),
        answer_tokens_mean=round(statistics.fmean(len(a) for a in run.answers), 1),
        perplexity=round(perplexity(run.logprobs), 4),
        reference_perplexity=round(perplexity(reference.logprobs), 4),
        scored_tokens=len(run.logprobs),
        windows=len(spans),
        wall_s=run.wall_s,
    )


def markdown(records: list[ModeRecord]) -> str:
    """One row per mode; the first is the reference."""
    lines = [
        "| mode | settings | identical greedy answers | first divergence (tokens) mean / median | perplexity | vs reference |",
        "|---|---|---|---|---|---|",
    ]
    for r in records:
        settings = ", ".join(f"{k}={v}" for k, v in r.settings.items()) or "defaults"
        a = r.agreement
        identical = f"{a.identical} / {a.prompts} ({100 * a.share_identical:.1f} %)"
        divergence = (
            "—"
            if a.first_divergence_mean is None
            else f"{a.first_divergence_mean:.1f} / {a.first_divergence_median:.0f}"
        )
        change = 100 * (r.perplexity / r.reference_perplexity - 1)
        lines.append(f"| {r.mode} | {settings} | {identical} | {divergence} | {r.perplexity:.3f} | {change:+.2f} % |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, type=lambda text: str(Path(text).expanduser()))
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"))
    parser.add_argument("--variant", action="append", type=parse_variant, required=True, help="NAME:key=value,...")
    parser.add_argument("--prompts", type=int, default=200, help="distinct greedy prompts")
    parser.add_argument("--max-tokens", type=int, default=64, help="greedy answer tokens at most")
    parser.add_argument("--text", type=Path, default=DEFAULT_TEXT, help="held-out text for perplexity")
    parser.add_argument("--text-tokens", type=int, default=8192, help="text tokens scored at most")
    parser.add_argument("--window", type=int, default=512, help="tokens per perplexity window")
    parser.add_argument("--stride", type=int, default=256, help="tokens between window starts")
    parser.add_argument("-c", "--concurrency", type=int, default=1, help="requests in flight")
    parser.add_argument("--deadline", type=float, default=3600.0, help="seconds each mode may take")
    args = parser.parse_args()
    for flag, value, low in (
        ("--prompts", args.prompts, 1),
        ("--max-tokens", args.max_tokens, 1),
        ("--text-tokens", args.text_tokens, 2),
        ("--concurrency", args.concurrency, 1),
    ):
        if value < low:
            parser.error(f"{flag} must be >= {low}, got {value}")
    if args.deadline <= 0:
        parser.error(f"--deadline must be > 0, got {args.deadline}")
    if not args.text.is_file():
        parser.error(f"--text: no file {args.text}")
    try:
        prompts = agreement_prompts(args.prompts)
        settings = {v.name: variant_settings(v, args.model, args.dtype, args.concurrency) for v in args.variant}
    except (ValueError, SettingsError) as exc:
        parser.error(str(exc))
    if len(settings) != len(args.variant):
        parser.error("--variant: give each mode its own name")
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    text_ids = text_token_ids(tokenizer, args.text.read_text(encoding="utf-8"), args.text_tokens)
    try:
        spans = windows(len(text_ids), args.window, args.stride)
    except ValueError as exc:
        parser.error(f"--window/--stride: {exc}")
    if not spans:
        parser.error(f"--text: {args.text} has fewer than 2 tokens")
    reference: ModeRun | None = None
    records: list[ModeRecord] = []
    for variant in args.variant:
        run = run_mode(
            settings[variant.name], prompts, args.max_tokens, text_ids, spans, args.concurrency, args.deadline
        )
        gc.collect()  # the mode's engine and weights, before the next one loads
        reference = reference or run
        records.append(mode_record(variant, run, reference, spans))
        sys.stdout.write(json.dumps(records[-1].line()) + "\n")
        sys.stdout.flush()
    sys.stdout.write(markdown(records) + "\n")


if __name__ == "__main__":
    main()
