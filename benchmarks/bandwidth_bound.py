"""One request at a time against the memory-bandwidth bound measured in the same run.

At concurrency 1 a decode step reads every weight once (and the request's keys and values), so
its time cannot go below ``bytes read / read bandwidth``. This benchmark counts the bytes a step
reads from the checkpoint (every tensor at the serving dtype's width, a quantized folder's integer
weights at theirs and, for a ``quantization=int8`` variant, the decoder's projections at one byte,
as the output head under ``quantize_lm_head``; the input embedding only where the output head does
not share it, since a step reads one of its rows), adds the keys and values of the request's context
(at the width the engine keeps them), and runs ``traffic.py`` distinct prompts one at a time through
the engine in-process for each ``--variant`` (as in ``engine_ab.py``).

The read bandwidth is measured with the engine's thread count in a process of its own (sums over
a buffer far larger than the caches) before every request, with the engine idle, and once after
the last: a shared host's bandwidth moves by half within a minute, so each request's time per
output token is set against the bound from the readings on either side of it (the median of each
reading's sums), and ``ratio`` is the median of those per-request ratios. ``ratio_at_best`` sets the
median time per token against the best sum of the whole run instead: the strictest reading.

Prints one JSON line per variant: the bound, ITL p50/p99, the time per output token (which counts
every token of a speculative step) and both ratios; below 1 only with speculative decoding.

    python -m benchmarks.bandwidth_bound --model ~/.cache/triton-chat/models/SmolLM2-135M-Instruct --dtype float32 \\
        --variant auto: --variant bf16kv:kv_cache_dtype=bfloat16
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from benchmarks.engine_ab import parse_variant, variant_settings
from benchmarks.engine_runs import EngineRun, add_in_process_workload_arguments, run_engine
from benchmarks.traffic import TrafficRequest, build_requests, workload_from
from python_backend.model.quantization import plan_quantization
from python_backend.protocol.settings import EngineSettings, SettingsError

_WIDTH = {"float32": 4, "bfloat16": 2, "float16": 2}
_EMBEDDINGS = ("embed_tokens.weight", "wte.weight", "word_embeddings.weight")
# The decoder's linear layers, which ``--quantization int8`` makes int8.
_PROJECTIONS = tuple(f"{name}_proj.weight" for name in ("q", "k", "v", "o", "gate", "up", "down"))
_INTEGER_WIDTH = {"I8": 1, "U8": 1, "I16": 2, "I32": 4}
_HEAD = "lm_head.weight"


@dataclass(frozen=True)
class StepBytes:
    weights: int  # bytes of weights one decode step reads
    kv_per_token: int  # bytes of keys and values per context position, all layers


def read_buffer(megabytes: int) -> torch.Tensor:
    """A float32 buffer of ``megabytes``, its pages touched, to time sums over."""
    buffer = torch.ones(megabytes * (1 << 20) // 4, dtype=torch.float32)
    buffer.sum()
    return buffer


def sum_rates(buffer: torch.Tensor, repeats: int) -> list[float]:
    """Bytes/s of each of ``repeats`` sums over ``buffer``, with torch's current threads."""
    rates = []
    for _ in range(repeats):
        started = time.perf_counter()
        buffer.sum()
        rates.append(buffer.numel() * buffer.element_size() / (time.perf_counter() - started))
    return rates


def _serve_readings(connection: Connection, threads: int, megabytes: int) -> None:
    """The reader process: one buffer, then five sums' rates per request, until None."""
    torch.set_num_threads(threads)
    buffer = read_buffer(megabytes)
    while connection.recv() is not None:
        connection.send(sum_rates(buffer, 5))


class BandwidthReader:
    """Read bandwidth on demand from a process of its own, its buffer allocated once: an OpenMP team
    started in the engine's process would share the cores with the engine's afterwards (measured:
    48-50 ms a token became 70). ``read()`` returns one reading's sums (bytes/s each)."""

    def __init__(self, threads: int, megabytes: int) -> None:
        context = multiprocessing.get_context("spawn")
        self._connection, child = context.Pipe()
        self._process = context.Process(target=_serve_readings, args=(child, threads, megabytes), daemon=True)
        self._process.start()
        child.close()

    def read(self) -> list[float]:
        self._connection.send(True)
        return list(self._connection.recv())

    def close(self) -> None:
        self._connection.send(None)
        self._process.join(timeout=30)
        if self._process.is_alive():
            self._process.kill()
            self._process.join()


def step_bytes(
    model: Path, dtype: str, kv_width: int, quantization: str = "auto", head_int8: bool = False
) -> StepBytes:
    """What one decode step of the checkpoint in ``model`` reads, at ``dtype``'s width: the decoder's
    projections at one byte under ``quantization=int8`` (made at load), a quantized folder's integer
    tensors at their stored width (the engine keeps them so), and with ``head_int8``
    (``quantize_lm_head``) the output head at one byte; ``gguf`` counts the widened folder."""
    config = json.loads((model / "config.json").read_text())
    text = config.get("text_config", config)
    quantized_folder = quantization == "auto" and "quantization_config" in (config.keys() | text.keys())
    total, embedding = 0, 0
    for shard in sorted(model.glob("*.safetensors")):
        with safe_open(str(shard), framework="pt") as tensors:
            for name in tensors.keys():  # noqa: SIM118  (safe_open has keys(), no __iter__)
                tensor = tensors.get_slice(name)
                width = _WIDTH[dtype]
                if quantization == "int8" and name.endswith(_PROJECTIONS) and ".layers." in name:
                    width = 1
                elif head_int8 and name.endswith((_HEAD, *_EMBEDDINGS)):
                    width = 1  # a tied head's int8 copy is what a step reads; the lookup reads one row
                elif quantized_folder and tensor.get_dtype() in _INTEGER_WIDTH:
                    width = _INTEGER_WIDTH[tensor.get_dtype()]
                size = math.prod(tensor.get_shape()) * width
                total += size
                if name.endswith(_EMBEDDINGS):
                    embedding += size
    if not total:
        raise SystemExit(f"{model} has no .safetensors weights to count")
    tied = bool(config.get("tie_word_embeddings", text.get("tie_word_embeddings", True)))
    read = total if tied else total - embedding  # untied: a step reads one embedding row
    heads = int(text["num_attention_heads"])
    head_dim = int(text.get("head_dim") or int(text["hidden_size"]) // heads)
    kv = 2 * int(text["num_hidden_layers"]) * int(text.get("num_key_value_heads", heads)) * head_dim * kv_width
    return StepBytes(weights=read, kv_per_token=kv)


def _kv_width(chosen: EngineSettings, dtype: str, config: dict[str, Any]) -> int:
    """Bytes per key or value element as the loader keeps them: bfloat16 when asked, in a bfloat16
    model, and by default under W8A8 layers of a float32 model (where the C attention kernel builds)."""
    if chosen.kv_cache_dtype == "bfloat16" or dtype == "bfloat16":
        return 2
    if chosen.kv_cache_dtype == "auto" and plan_quantization(chosen.quantization, config).int8_activations:
        return 2
    return 4


def _run_between_readings(
    settings: EngineSettings, requests: list[TrafficRequest], threads: int, megabytes: int
) -> tuple[EngineRun, list[list[float]]]:
    """The requests one at a time, a bandwidth reading before each and one after the last."""
    reader = BandwidthReader(threads, megabytes)
    readings: list[list[float]] = []
    try:
        run = run_engine(settings, requests, concurrency=1, before_each=lambda _: readings.append(reader.read()))
        readings.append(reader.read())
    finally:
        reader.close()
    return run, readings


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, type=lambda text: Path(text).expanduser())
    parser.add_argument("--dtype", default="float32", choices=("bfloat16", "float32"))
    parser.add_argument("--variant", action="append", type=parse_variant, required=True, help="NAME:key=value,...")
    parser.add_argument("-n", "--requests", type=int, default=4, help="requests per variant, one at a time")
    add_in_process_workload_arguments(parser, output_range=0)
    parser.add_argument("--buffer-mb", type=int, default=1024, help="bandwidth buffer (far above the caches)")
    args = parser.parse_args()
    workload = workload_from(args)
    requests = build_requests(workload, args.requests)
    threads = torch.get_num_threads()  # the engine's count (run_engine gives it to the engine thread)
    try:
        settings = {v.name: variant_settings(v, str(args.model), args.dtype, 1) for v in args.variant}
    except SettingsError as exc:
        parser.error(str(exc))
    config = json.loads((args.model / "config.json").read_text())
    for variant in args.variant:
        chosen = settings[variant.name]
        bytes_read = step_bytes(
            args.model, args.dtype, _kv_width(chosen, args.dtype, config), chosen.quantization, chosen.quantize_lm_head
        )
        # The mean context over a request's decode steps: its prompt (about 1.3 tokens a word
        # with the chat template) and half its output.
        context = 1.3 * args.input_len + args.output_len / 2
        step = bytes_read.weights + bytes_read.kv_per_token * context
        run, readings = _run_between_readings(chosen, requests, chosen.torch_threads or threads, args.buffer_mb)
        around = [
            (statistics.median(before) + statistics.median(after)) / 2
            for before, after in zip(readings, readings[1:], strict=False)
        ]
        ratios = [tpot / (step / rate * 1e3) for tpot, rate in zip(run.tpot_ms, around, strict=True) if tpot > 0]
        typical = statistics.median(around)
        best = max(max(reading) for reading in readings)
        record = {
            "variant": variant.name,
            "workload": asdict(workload),
            "read_bandwidth_gb_s": round(typical / 1e9, 2),
            "read_bandwidth_gb_s_range": [round(min(around) / 1e9, 2), round(max(around) / 1e9, 2)],
            "best_read_gb_s": round(best / 1e9, 2),
            "weight_bytes": bytes_read.weights,
            "kv_bytes_per_token": bytes_read.kv_per_token,
            "bound_ms": float(f"{step / typical * 1e3:.4g}"),
            "itl_ms_p50": run.itl_ms_p50,
            "itl_ms_p99": run.itl_ms_p99,
            "tpot_ms_p50": run.tpot_ms_p50,
            "ratio": round(statistics.median(ratios), 3),
            "ratio_at_best": round(run.tpot_ms_p50 / (step / best * 1e3), 3),
            "output_tokens_per_s": run.output_tokens_per_s,
        }
        sys.stdout.write(json.dumps(record) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
