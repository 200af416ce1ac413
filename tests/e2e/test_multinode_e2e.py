"""One model over two nodes: two network namespaces joined by a veth pair stand for two hosts.

Node 0 (namespace A, 10.231.0.1) runs ``triton-chat serve --tensor-parallel-size 2 --nnodes 2``,
node 1 (namespace B, 10.231.0.2) ``triton-chat worker`` with node 0's flags and ``--node-rank
1``; the ranks meet at 10.231.0.1 over the veth pair only. The answers (greedy text and
logprobs) are one rank's; node 1 killed under load costs the requests it held a 503
``engine_failed``; node 1 started again brings the model back with the same answers; and no
process of either node is left at the end. The client runs in namespace A, from threads that
entered it. Needs root with CAP_NET_ADMIN and ``ip``: skipped with the reason otherwise.
"""

from __future__ import annotations

import ctypes
import functools
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import httpx
import psutil
import pytest

from openai_frontend.launcher import supervisor
from python_backend.protocol.errors import engine_failed
from tests.e2e.test_smoke import _finish, _read_until, _start_launcher
from tests.e2e.test_tensor_parallel_e2e import PROMPTS, _rank_pids

REPO_ROOT = Path(__file__).resolve().parents[2]
NODE0_ADDRESS, NODE1_ADDRESS = "10.231.0.1", "10.231.0.2"
MASTER_PORT = 29500  # the namespaces are this test's own: fixed ports cannot clash
FRONTEND_PORT = 8000
CLONE_NEWNET = 0x40000000
GREEDY = PROMPTS[:4]
RESTART_DEADLINE_S = supervisor.HANG_RESTART_S + supervisor.PROBE_INTERVAL_S + 240
EXIT_S = 60.0
ENGINE_FAILED_MESSAGE = engine_failed().message
T = TypeVar("T")


@dataclass(frozen=True)
class Namespaces:
    node0: str
    node1: str

    def inode(self, name: str) -> int:
        return os.stat(f"/run/netns/{name}").st_ino


def _ip(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)


def _processes_in(inode: int) -> list[psutil.Process]:
    """Every live (not zombie) process whose network namespace is ``inode``."""
    found = []
    for process in psutil.process_iter():
        try:
            if os.stat(f"/proc/{process.pid}/ns/net").st_ino == inode and process.status() != psutil.STATUS_ZOMBIE:
                found.append(process)
        except (OSError, psutil.Error):
            continue
    return found


@pytest.fixture
def namespaces() -> Iterator[Namespaces]:
    """Two fresh namespaces joined by a veth pair; removed, with anything left in them, at the end."""
    if sys.platform != "linux" or shutil.which("ip") is None:
        pytest.skip("needs Linux and iproute2's `ip` to make network namespaces")
    tag = uuid.uuid4().hex[:8]  # unique: two runs side by side do not clash
    names = Namespaces(f"tchat-{tag}-a", f"tchat-{tag}-b")
    made = _ip("netns", "add", names.node0)
    if made.returncode != 0:
        pytest.skip(f"cannot make a network namespace (needs root with CAP_NET_ADMIN): {made.stderr.strip()}")
    try:
        steps = [
            ("netns", "add", names.node1),
            ("link", "add", f"tc{tag}a", "netns", names.node0, "type", "veth", "peer", "name", f"tc{tag}b",
             "netns", names.node1),
            ("-n", names.node0, "addr", "add", f"{NODE0_ADDRESS}/24", "dev", f"tc{tag}a"),
            ("-n", names.node1, "addr", "add", f"{NODE1_ADDRESS}/24", "dev", f"tc{tag}b"),
            ("-n", names.node0, "link", "set", f"tc{tag}a", "up"),
            ("-n", names.node1, "link", "set", f"tc{tag}b", "up"),
            ("-n", names.node0, "link", "set", "lo", "up"),
            ("-n", names.node1, "link", "set", "lo", "up"),
        ]  # fmt: skip
        for step in steps:
            done = _ip(*step)
            if done.returncode != 0:
                pytest.skip(f"cannot set up the veth pair (`ip {' '.join(step)}`): {done.stderr.strip()}")
        yield names
    finally:
        for name in (names.node0, names.node1):
            if Path(f"/run/netns/{name}").exists():
                for process in _processes_in(names.inode(name)):  # only this test's processes live there
                    process.kill()
                _ip("netns", "del", name)


def _enter(name: str) -> None:
    """Move the calling thread into network namespace ``name`` (a thread's own setting)."""
    libc = ctypes.CDLL(None, use_errno=True)
    handle = os.open(f"/run/netns/{name}", os.O_RDONLY)
    try:
        if libc.setns(handle, CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"setns into {name}")
    finally:
        os.close(handle)


class Client:
    """HTTP calls to node 0's frontend, each made from a thread inside node 0's namespace."""

    def __init__(self, namespace: str) -> None:
        self._pool = ThreadPoolExecutor(8, initializer=_enter, initargs=(namespace,))
        self._base = f"http://127.0.0.1:{FRONTEND_PORT}"

    def call(self, work: Callable[[httpx.Client], T]) -> Future[T]:
        def run() -> T:
            with httpx.Client(base_url=self._base, timeout=300) as http:
                return work(http)

        return self._pool.submit(run)

    def close(self) -> None:
        self._pool.shutdown(wait=True)


def _body(content: str, max_tokens: int, **extra: Any) -> dict[str, Any]:
    messages = [{"role": "user", "content": content}]
    return {"model": "tiny", "messages": messages, "temperature": 0, "max_tokens": max_tokens, **extra}


def _chat(http: httpx.Client, content: str, max_tokens: int) -> httpx.Response:
    return http.post("/v1/chat/completions", json=_body(content, max_tokens, logprobs=True))


def _long(http: httpx.Client, i: int) -> httpx.Response:
    """A request that runs for minutes unless the model fails under it."""
    return http.post("/v1/chat/completions", json=_body(f"write forever {i}", 4000, ignore_eos=True))


def _long_stream(http: httpx.Client, started: threading.Event) -> str:
    """A long stream's text as it came: ``started`` is set at its first token."""
    body = _body("write forever, streaming", 4000, ignore_eos=True, stream=True)
    seen: list[str] = []
    with http.stream("POST", "/v1/chat/completions", json=body) as reply:
        for line in reply.iter_lines():
            seen.append(line)
            if '"content"' in line:
                started.set()
    return "\n".join(seen)


def _answer(reply: httpx.Response) -> tuple[str, list[tuple[str, float]]]:
    assert reply.status_code == 200, reply.text
    choice = reply.json()["choices"][0]
    return str(choice["message"]["content"]), [(t["token"], t["logprob"]) for t in choice["logprobs"]["content"]]


def _greedy(call: Callable[[Callable[[httpx.Client], httpx.Response]], Future[httpx.Response]]) -> list[Any]:
    futures = [call(functools.partial(_chat, content=GREEDY[i], max_tokens=12 + 3 * i)) for i in range(len(GREEDY))]
    return [_answer(f.result()) for f in futures]


def _same(one: list[Any], other: list[Any]) -> bool:
    """Same text and tokens; logprobs equal up to the all-reduce's float32 rounding."""
    for (text, tokens), (text2, tokens2) in zip(one, other, strict=True):
        if text != text2 or [t for t, _ in tokens] != [t for t, _ in tokens2]:
            return False
        if any(abs(a - b) > 1e-3 for (_, a), (_, b) in zip(tokens, tokens2, strict=True)):
            return False
    return True


def _node_flags(model_dir: Path) -> list[str]:
    """The flags both nodes get (the ranks refuse to run with different ones)."""
    return [
        "--model", str(model_dir), "--dtype", "float32", "--device", "cpu", "--max-iter-times", "64",
        "--tensor-parallel-size", "2", "--nnodes", "2", "--master-addr", NODE0_ADDRESS,
        "--master-port", str(MASTER_PORT),
    ]  # fmt: skip


def _environment() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GLOO_", "MASTER_", "PET_"))}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), env.get("PYTHONPATH", "")])
    return env


def _in(namespace: str, *command: str) -> subprocess.Popen[str]:
    # `ip netns exec` execs the command: the process id is the launcher's, and so are its signals.
    return subprocess.Popen(
        ["ip", "netns", "exec", namespace, sys.executable, "-m", "openai_frontend.launcher", *command],
        env=_environment(),
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def _worker(names: Namespaces, model_dir: Path) -> subprocess.Popen[str]:
    return _in(names.node1, "worker", *_node_flags(model_dir), "--node-rank", "1")


def _drain(process: subprocess.Popen[str], lines: list[str]) -> None:
    """Keep reading ``process``'s stderr so that it never blocks on a full pipe."""
    assert process.stderr is not None
    stream = process.stderr

    def read() -> None:
        for line in stream:
            lines.append(line)

    ThreadPoolExecutor(1).submit(read)


def _stop(process: subprocess.Popen[str], stop_signal: int) -> int:
    """Signal ``process`` and wait for it; killed (its session too) past ``EXIT_S``."""
    process.send_signal(stop_signal)
    try:
        return process.wait(EXIT_S * 2)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        raise


def _tree(process: subprocess.Popen[str]) -> set[int]:
    try:
        return {process.pid, *(child.pid for child in psutil.Process(process.pid).children(recursive=True))}
    except psutil.NoSuchProcess:
        return set()


def _alive(pids: set[int]) -> list[int]:
    alive = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                alive.append(pid)
        except psutil.NoSuchProcess:
            continue
    return alive


def _wait_until(condition: Callable[[], bool], timeout_s: float, interval_s: float = 0.5) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(interval_s)
    return condition()


def _one_rank(model_dir: Path, tmp_path: Path) -> list[Any]:
    launcher, port = _start_launcher(model_dir, tmp_path, "--max-iter-times", "64")
    lines: list[str] = []
    try:
        _read_until(launcher, f"serving 'tiny' at http://127.0.0.1:{port}/v1", lines)
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=300) as http:
            pool = ThreadPoolExecutor(len(GREEDY))

            def call(work: Callable[[httpx.Client], httpx.Response]) -> Future[httpx.Response]:
                return pool.submit(work, http)

            answers = _greedy(call)
            pool.shutdown()
            return answers
    finally:
        assert _finish(launcher, signal.SIGINT, lines) == 0, "".join(lines)


def test_a_model_over_two_nodes(namespaces: Namespaces, tiny_llama_dir: Path, tmp_path: Path) -> None:
    one = _one_rank(tiny_llama_dir, tmp_path)
    assert all(text for text, _ in one) and len({text for text, _ in one}) == len(GREEDY)

    serve_lines: list[str] = []
    worker_lines: list[str] = []
    seen: set[int] = set()  # every process either node ever ran, to check none is left
    serve = _in(
        namespaces.node0, "serve", *_node_flags(tiny_llama_dir), "--node-rank", "0", "--served-model-name", "tiny",
        "--port", str(FRONTEND_PORT), "--triton-log", str(tmp_path / "tritonserver.log"), "--ready-timeout", "400",
    )  # fmt: skip
    worker = _worker(namespaces, tiny_llama_dir)
    _drain(worker, worker_lines)
    client = Client(namespaces.node0)
    try:
        _read_until(serve, f"serving 'tiny' at http://127.0.0.1:{FRONTEND_PORT}/v1", serve_lines, timeout=600)
        _drain(serve, serve_lines)
        two = _greedy(client.call)
        seen |= _tree(serve) | _tree(worker)
        node1_ranks = [p for p in _rank_pids(tiny_llama_dir) if p in _tree(worker)]
        assert len(node1_ranks) == 1, worker_lines

        # Node 1 lost under load: what node 0 held ends with 503 engine_failed.
        started = threading.Event()
        held = [client.call(functools.partial(_long, i=i)) for i in range(3)]
        stream = client.call(lambda http: _long_stream(http, started))
        assert started.wait(180), "the long requests never ran"
        worker.send_signal(signal.SIGKILL)
        worker.wait(EXIT_S)
        replies = [f.result(timeout=300) for f in held]
        streamed = stream.result(timeout=300)
        node1_gone = _wait_until(lambda: not _alive(set(node1_ranks)), EXIT_S)
        unready = client.call(lambda http: http.get("/health/ready")).result().status_code

        # Node 1 back: the supervisor restarts node 0's model, which waits for node 1's rank.
        worker_lines.clear()
        worker = _worker(namespaces, tiny_llama_dir)
        _drain(worker, worker_lines)
        back = _wait_until(
            lambda: client.call(lambda http: http.get("/health/ready")).result().status_code == 200,
            RESTART_DEADLINE_S,
            2.0,
        )
        after = _greedy(client.call) if back else []
        seen |= _tree(serve) | _tree(worker)
    finally:
        client.close()
        try:
            serve_code = _stop(serve, signal.SIGINT)
        finally:
            worker_code = _stop(worker, signal.SIGTERM)
    log = "".join(serve_lines) + "".join(worker_lines)
    assert _same(two, one), (two, one)
    assert [r.status_code for r in replies] == [503] * 3 and all("engine_failed" in r.text for r in replies), [
        r.text for r in replies
    ]
    # A stream already answering ends with the error in its last chunk (engine_failed's message).
    assert "data: [DONE]" in streamed and ENGINE_FAILED_MESSAGE in streamed, streamed[-2000:]
    assert node1_gone and unready == 503
    assert back, log
    assert _same(after, one), (after, one)
    assert serve_code == 0 and worker_code == 0, log
    assert _alive(seen) == [], log
    assert _processes_in(namespaces.inode(namespaces.node0)) == []
    assert _processes_in(namespaces.inode(namespaces.node1)) == []
    assert _rank_pids(tiny_llama_dir) == []
