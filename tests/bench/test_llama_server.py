"""benchmarks/llama_server.py without llama.cpp: the command lines it runs, the GGUF files it keeps
and reuses, the forced-length check's request and verdict, and the flags it refuses. (A run
against a real llama-server needs llama.cpp built as its docstring says; it is not a test.)"""

from __future__ import annotations

import asyncio
import json
import stat
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from benchmarks.http_stream import StreamingConnection
from benchmarks.llama_server import (
    CONTEXT_PER_SLOT,
    LlamaTools,
    check_forced_length,
    convert_command,
    converter_env,
    gguf_path,
    prepare_gguf,
    quantize_command,
    server_command,
    server_env,
)

ROOT = Path(__file__).resolve().parents[2]


def test_server_command_gives_each_user_a_slot_and_binds_loopback() -> None:
    tools = LlamaTools(Path("/src/llama.cpp"))
    command = server_command(tools, Path("/m/x-Q8_0.gguf"), 8123, 16, 2)
    assert command[0] == "/src/llama.cpp/build/bin/llama-server"

    def value(flag: str) -> str:
        return command[command.index(flag) + 1]

    assert (value("-m"), value("--host"), value("--port"), value("--alias")) == (
        "/m/x-Q8_0.gguf",
        "127.0.0.1",
        "8123",
        "bench",
    )
    assert (value("--threads"), value("--threads-batch"), value("--parallel")) == ("2", "2", "16")
    assert value("--ctx-size") == str(16 * CONTEXT_PER_SLOT)  # llama-server splits it between the slots
    assert "--cont-batching" in command and "--no-webui" in command


def test_conversion_and_quantization_commands() -> None:
    tools = LlamaTools(Path("/src/llama.cpp"))
    assert convert_command(tools, Path("/models/m"), Path("/c/m-BF16.gguf")) == [
        sys.executable, "/src/llama.cpp/convert_hf_to_gguf.py", "/models/m", "--outtype", "bf16",
        "--outfile", "/c/m-BF16.gguf",
    ]  # fmt: skip
    assert quantize_command(tools, Path("/c/m-BF16.gguf"), Path("/c/m-Q4_1.gguf"), kind="Q4_1", threads=2) == [
        "/src/llama.cpp/build/bin/llama-quantize", "/c/m-BF16.gguf", "/c/m-Q4_1.gguf", "Q4_1", "2",
    ]  # fmt: skip
    assert gguf_path(Path("/c"), Path("/models/SmolLM2"), "Q8_0") == Path("/c/SmolLM2-Q8_0.gguf")


def test_environments(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLAMA_ARG_THREADS", "7")
    monkeypatch.setenv("PYTHONPATH", "/already")
    env = server_env()
    assert "LLAMA_ARG_THREADS" not in env and env["PYTHONPATH"] == "/already"
    assert converter_env(Path("/site"))["PYTHONPATH"] == "/site:/already"
    assert converter_env(None)["PYTHONPATH"] == "/already"


def _executable(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


def _fake_llama(root: Path, calls: Path, quantize_exit: int = 0) -> LlamaTools:
    """A llama.cpp folder whose converter and quantizer write their output and log each call."""
    tools = LlamaTools(root)
    tools.convert.parent.mkdir(parents=True, exist_ok=True)
    tools.convert.write_text(
        "import sys\n"
        f"open({str(calls)!r}, 'a').write('convert ' + ' '.join(sys.argv[1:]) + '\\n')\n"
        "open(sys.argv[sys.argv.index('--outfile') + 1], 'w').write('bf16')\n"
    )
    _executable(tools.quantize, f'#!/bin/sh\necho "quantize $*" >> {calls}\necho "$3" > "$2"\nexit {quantize_exit}\n')
    _executable(tools.server, "#!/bin/sh\nexit 1\n")
    return tools


def test_gguf_files_are_made_once_and_reused(tmp_path: Path) -> None:
    calls = tmp_path / "calls.txt"
    tools = _fake_llama(tmp_path / "llama.cpp", calls)
    assert tools.missing() == []
    model, cache = tmp_path / "MyModel", tmp_path / "cache"
    files = prepare_gguf(tools, model, cache, ["BF16", "Q8_0", "Q4_1"], 2, convert_path=tmp_path / "site")
    assert files == {kind: cache / f"MyModel-{kind}.gguf" for kind in ("BF16", "Q8_0", "Q4_1")}
    assert files["Q4_1"].read_text().strip() == "Q4_1" and files["BF16"].read_text() == "bf16"
    made = calls.read_text().splitlines()
    assert [line.split()[0] for line in made] == ["convert", "quantize", "quantize"]
    assert made[1].endswith("MyModel-Q8_0.partial.gguf Q8_0 2")  # written aside, renamed when done
    assert not list(cache.glob("*.partial.gguf"))
    prepare_gguf(tools, model, cache, ["BF16", "Q8_0", "Q4_1"], 2)
    assert calls.read_text().splitlines() == made  # nothing made again


def test_a_failed_step_keeps_nothing_and_names_its_log(tmp_path: Path) -> None:
    tools = _fake_llama(tmp_path / "llama.cpp", tmp_path / "calls.txt", quantize_exit=3)
    cache = tmp_path / "cache"
    with pytest.raises(RuntimeError, match=r"llama-quantize of M-Q8_0.gguf failed \(exit 3\); see .*conversion.log"):
        prepare_gguf(tools, tmp_path / "M", cache, ["Q8_0"], 2)
    assert sorted(p.name for p in cache.glob("*.gguf")) == ["M-BF16.gguf"]


def _client(completion_tokens: int, seen: list[dict[str, object]]) -> httpx.Client:
    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(json.loads(request.content))
        return httpx.Response(200, json={"usage": {"completion_tokens": completion_tokens, "prompt_tokens": 9}})

    return httpx.Client(transport=httpx.MockTransport(answer))


def test_the_length_check_forces_the_length_as_the_traffic_does() -> None:
    seen: list[dict[str, object]] = []
    with _client(24, seen) as client:
        check_forced_length(client, "http://127.0.0.1:1/v1")
    (body,) = seen
    # What llama-server reads: max_tokens (its n_predict) and ignore_eos (end-of-generation banned).
    assert body["max_tokens"] == 24 and body["ignore_eos"] is True and body["temperature"] == 0
    assert body["stream"] is False and "stream_options" not in body
    with _client(3, []) as client, pytest.raises(RuntimeError, match="made 3 tokens where 24 were forced"):
        check_forced_length(client, "http://127.0.0.1:1/v1")


def _main(*args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "benchmarks.llama_server", *args]
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)


def test_bad_flags_name_the_flag(tmp_path: Path) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    done = _main("--model", str(model), "--llama-dir", str(tmp_path / "nowhere"))
    assert done.returncode == 2 and "--llama-dir: not a built llama.cpp source folder" in done.stderr
    done = _main("--model", str(tmp_path), "--llama-dir", str(tmp_path))
    assert done.returncode == 2 and "--model:" in done.stderr
    done = _main("--model", str(model), "--llama-dir", str(tmp_path), "--type", "Q5_K")
    assert done.returncode == 2 and "--type" in done.stderr and "BF16, Q8_0, Q4_1" in done.stderr
    done = _main("--model", str(model), "--llama-dir", str(tmp_path), "--convert-path", str(tmp_path / "none"))
    assert done.returncode == 2 and "--convert-path: no folder" in done.stderr
    done = _main("--model", str(model), "--llama-dir", str(tmp_path), "-c", "0")
    assert done.returncode == 2 and "-c and --threads must be >= 1" in done.stderr


def test_the_load_client_reconnects_to_a_server_that_closes_after_each_stream() -> None:
    """llama-server closes a connection after each streamed answer without ``Connection: close``;
    the load generator's next request on it must be sent again on a new one, not counted failed."""

    async def serve_once(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while (await reader.readline()) not in (b"\r\n", b""):
            pass  # the head; the body is small and left unread
        event = b'data: {"n": 1}\n\n'
        head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
        writer.write(head + b"%x\r\n%s\r\n0\r\n\r\n" % (len(event), event))
        await writer.drain()
        writer.close()

    async def three_requests() -> list[list[bytes]]:
        server = await asyncio.start_server(serve_once, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        connection = StreamingConnection(f"http://127.0.0.1:{port}/v1/chat/completions")
        try:
            answers = []
            for _ in range(3):
                answers.append([line async for line in connection.post_lines({"stream": True})])
                await asyncio.sleep(0.05)  # the server's close reaches the client first, as in a run
            return answers
        finally:
            await connection.close()
            server.close()
            await server.wait_closed()

    assert asyncio.run(three_requests()) == [[b'data: {"n": 1}', b""]] * 3
