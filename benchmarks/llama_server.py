"""llama.cpp's own ``llama-server`` as a peer: the same model as GGUF BF16, Q8_0 and Q4_1, same traffic.

llama.cpp is never part of triton-chat: it runs beside it, built from its own source in a folder
outside this repository. Build it once (the copy of llama.cpp vendored in the llama-cpp-python
sdist from PyPI; HTTPS, the tests and the web UI's prebuilt download are off):

    export LLAMA_DIR=$HOME/llama-peer && mkdir -p $LLAMA_DIR && cd $LLAMA_DIR
    pip download --no-deps --no-binary :all: llama-cpp-python
    tar xzf llama_cpp_python-*.tar.gz && cd llama_cpp_python-*/vendor/llama.cpp
    cmake -B build -DLLAMA_OPENSSL=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_TESTS=OFF \\
        -DLLAMA_BUILD_EXAMPLES=OFF -DGGML_NATIVE=ON -DCMAKE_BUILD_TYPE=Release
    cmake --build build --target llama-server llama-quantize -j2
    /path/to/triton-chat/.venv/bin/pip install --target $LLAMA_DIR/convert-site sentencepiece==0.2.1

``--llama-dir`` is that source folder (``.../vendor/llama.cpp``); nothing here builds it. The
last command (this project's pip, so that the wheel fits its Python) puts ``sentencepiece``, which
the folder's ``convert_hf_to_gguf.py`` imports and this project does not need, where
``--convert-path`` adds it to the script's PYTHONPATH; the script runs on this Python (torch and
transformers) with its own ``gguf``. The harness converts ``--model`` (a Hugging Face folder) to
GGUF BF16 with that script, quantizes it to Q8_0 and Q4_1 with ``llama-quantize``, and keeps the
files in ``<llama-dir>/gguf/`` so that later runs reuse them. For each ``--type`` and concurrency
it starts ``llama-server`` as its docs say for a CPU server (threads = the cores this process may
use, ``--parallel C`` slots with continuous batching, 2,048 context tokens per slot) on 127.0.0.1
and a free port, checks that it forces output lengths as the other servers do (``ignore_eos``:
llama-server then never samples an end-of-generation token, so ``max_tokens`` is reached; it
ignores ``min_tokens``), runs ``benchmarks.traffic``'s closed loop against its OpenAI-compatible
endpoint (2×C requests unless ``-n``), stops it, and prints one JSON line per run as
``traffic_compare`` does, then its Markdown table. Server logs and the conversion log are in
``<llama-dir>/gguf/``.

    python -m benchmarks.llama_server --model ~/.cache/triton-chat/models/SmolLM2-135M-Instruct \\
        --llama-dir $LLAMA_DIR/llama_cpp_python-0.3.36/vendor/llama.cpp --convert-path $LLAMA_DIR/convert-site \\
        -c 1 -c 16
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path

import httpx

from benchmarks.servers import ServedProcess, exit_on_sigterm
from benchmarks.traffic import (
    TrafficReport,
    TrafficRequest,
    Workload,
    add_workload_arguments,
    request_body,
    run_traffic,
    workload_from,
)
from benchmarks.traffic_compare import markdown
from openai_frontend.launcher.network import free_port

TYPES = ("BF16", "Q8_0", "Q4_1")  # llama.cpp's names; BF16 is converted, the others quantized from it
MODEL_NAME = "bench"
CONTEXT_PER_SLOT = 2048  # vLLM's --max-model-len in traffic_compare
_TIMEOUT_S, _DEADLINE_S, _SLO = 300.0, 1800.0, (1.0, 0.1)
_FORCED_TOKENS = 24  # the length check's answer: far longer than a one-word reply


@dataclass(frozen=True)
class LlamaTools:
    """The programs of a built llama.cpp source folder."""

    source: Path

    @property
    def server(self) -> Path:
        return self.source / "build" / "bin" / "llama-server"

    @property
    def quantize(self) -> Path:
        return self.source / "build" / "bin" / "llama-quantize"

    @property
    def convert(self) -> Path:
        return self.source / "convert_hf_to_gguf.py"

    def missing(self) -> list[str]:
        return [str(path) for path in (self.server, self.quantize, self.convert) if not path.is_file()]


def gguf_path(cache: Path, model_dir: Path, kind: str) -> Path:
    """Where the GGUF of ``model_dir`` in ``kind`` is kept."""
    return cache / f"{model_dir.name}-{kind}.gguf"


def convert_command(tools: LlamaTools, model_dir: Path, out: Path) -> list[str]:
    return [sys.executable, str(tools.convert), str(model_dir), "--outtype", "bf16", "--outfile", str(out)]


def quantize_command(tools: LlamaTools, source: Path, out: Path, *, kind: str, threads: int) -> list[str]:
    return [str(tools.quantize), str(source), str(out), kind, str(threads)]


def server_command(tools: LlamaTools, gguf: Path, port: int, concurrency: int, threads: int) -> list[str]:
    """llama-server for ``concurrency`` users at once: one slot each, continuous batching."""
    return [
        str(tools.server), "-m", str(gguf), "--host", "127.0.0.1", "--port", str(port), "--alias", MODEL_NAME,
        "--threads", str(threads), "--threads-batch", str(threads), "--parallel", str(concurrency),
        "--ctx-size", str(CONTEXT_PER_SLOT * concurrency), "--cont-batching", "--no-webui",
    ]  # fmt: skip


def server_env() -> dict[str, str]:
    """This environment without llama-server's own LLAMA_ARG_* settings, so the flags are the run's."""
    return {key: value for key, value in os.environ.items() if not key.startswith("LLAMA_ARG_")}


def converter_env(convert_path: Path | None) -> dict[str, str]:
    """This environment with ``convert_path`` first on PYTHONPATH (when given)."""
    env = dict(os.environ)
    if convert_path is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, (str(convert_path), env.get("PYTHONPATH"))))
    return env


def _run_step(
    step: str, make: Callable[[Path], list[str]], out: Path, log: Path, env: dict[str, str] | None = None
) -> None:
    """Run the command ``make`` gives for a temporary file, kept as ``out`` only when ``step`` succeeds,
    so that a run stopped halfway leaves nothing the next run would take for a finished file."""
    unfinished = out.with_name(out.stem + ".partial.gguf")
    with log.open("a") as sink:
        done = subprocess.run(make(unfinished), stdout=sink, stderr=subprocess.STDOUT, env=env, check=False)
    if done.returncode != 0 or not unfinished.is_file():
        unfinished.unlink(missing_ok=True)
        raise RuntimeError(f"{step} of {out.name} failed (exit {done.returncode}); see {log}")
    unfinished.replace(out)


def prepare_gguf(
    tools: LlamaTools, model_dir: Path, cache: Path, kinds: list[str], threads: int, convert_path: Path | None = None
) -> dict[str, Path]:
    """The GGUF file of each kind, converted or quantized now unless ``cache`` has it already."""
    cache.mkdir(parents=True, exist_ok=True)
    log = cache / "conversion.log"
    bf16 = gguf_path(cache, model_dir, "BF16")
    if not bf16.is_file():
        command = partial(convert_command, tools, model_dir)
        _run_step("convert_hf_to_gguf.py", command, bf16, log, converter_env(convert_path))
    files = {}
    for kind in kinds:
        out = gguf_path(cache, model_dir, kind)
        if not out.is_file():
            _run_step("llama-quantize", partial(quantize_command, tools, bf16, kind=kind, threads=threads), out, log)
        files[kind] = out
    return files


def check_forced_length(client: httpx.Client, base_url: str, timeout_s: float = 120.0) -> None:
    """Raise unless the server answers a one-word question with exactly the tokens asked for, as
    ``ignore_eos`` asks: every server in a comparison must generate the lengths the traffic sets."""
    body = request_body(MODEL_NAME, TrafficRequest(None, "Answer with one word: yes or no?", _FORCED_TOKENS))
    body.update(stream=False)
    body.pop("stream_options")
    response = client.post(f"{base_url}/chat/completions", json=body, timeout=timeout_s)
    response.raise_for_status()
    produced = response.json()["usage"]["completion_tokens"]
    if produced != _FORCED_TOKENS:
        raise RuntimeError(f"llama-server made {produced} tokens where {_FORCED_TOKENS} were forced (ignore_eos)")


def run_kind(
    tools: LlamaTools,
    kind: str,
    gguf: Path,
    workload: Workload,
    concurrencies: list[int],
    requests: int,
    threads: int,
    logs: Path,
) -> list[TrafficReport]:
    """One llama-server per concurrency on ``gguf``, each started, checked, loaded and stopped."""
    reports = []
    for c in concurrencies:
        port = free_port()
        label = f"llama-server {kind}"
        command = server_command(tools, gguf, port, c, threads)
        server = ServedProcess(label, command, server_env(), port, logs / f"llama-server-{kind}-c{c}.log")
        logs.mkdir(parents=True, exist_ok=True)
        server.start()
        try:
            with httpx.Client() as client:
                check_forced_length(client, server.base_url)
            report = asyncio.run(
                run_traffic(
                    server.base_url,
                    MODEL_NAME,
                    workload,
                    requests or 2 * c,
                    c,
                    None,
                    label,
                    _TIMEOUT_S,
                    _DEADLINE_S,
                    *_SLO,
                )
            )
        finally:
            server.stop()
        reports.append(report)
        sys.stdout.write(json.dumps(asdict(report)) + "\n")
        sys.stdout.flush()
    return reports


def _kind(text: str) -> str:
    kind = text.upper()
    if kind not in TYPES:
        raise argparse.ArgumentTypeError(f"choose from {', '.join(TYPES)}, got {text!r}")
    return kind


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, type=lambda text: Path(text).expanduser(), help="HF model folder")
    parser.add_argument(
        "--llama-dir", required=True, type=lambda text: Path(text).expanduser(), help="built llama.cpp source folder"
    )
    parser.add_argument(
        "--convert-path",
        type=lambda text: Path(text).expanduser(),
        help="a folder put first on convert_hf_to_gguf.py's PYTHONPATH (where sentencepiece was installed)",
    )
    parser.add_argument("--type", action="append", type=_kind, help=f"repeatable, from {', '.join(TYPES)}; default all")
    parser.add_argument("-c", "--concurrency", type=int, action="append", help="repeatable; default 1 and 16")
    parser.add_argument("-n", "--requests", type=int, default=0, help="requests per run (default 2*C)")
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)), help="default: usable cores")
    add_workload_arguments(parser)
    args = parser.parse_args()
    concurrencies = args.concurrency or [1, 16]
    if min(concurrencies) < 1 or args.requests < 0 or args.threads < 1:
        parser.error("-c and --threads must be >= 1 and -n >= 0")
    if not (args.model / "config.json").is_file():
        parser.error(f"--model: {args.model} is not a model folder (no config.json)")
    if args.convert_path is not None and not args.convert_path.is_dir():
        parser.error(f"--convert-path: no folder {args.convert_path}")
    tools = LlamaTools(args.llama_dir)
    if missing := tools.missing():
        parser.error(f"--llama-dir: not a built llama.cpp source folder (missing {', '.join(missing)}); see --help")
    signal.signal(signal.SIGTERM, exit_on_sigterm)
    kinds = list(dict.fromkeys(args.type or TYPES))
    cache = args.llama_dir / "gguf"
    files = prepare_gguf(tools, args.model.resolve(), cache, kinds, args.threads, args.convert_path)
    workload = workload_from(args, shared_len=512)  # traffic_compare's, so the prompts are the same
    reports: list[TrafficReport] = []
    for kind in kinds:
        reports += run_kind(
            tools, kind, files[kind], workload, concurrencies, args.requests, args.threads, cache / "logs"
        )
    sys.stdout.write(markdown(reports) + "\n")


if __name__ == "__main__":
    main()
