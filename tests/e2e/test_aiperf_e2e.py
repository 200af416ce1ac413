"""docs/own-triton.md's aiperf commands, run exactly as written: aiperf's Triton HTTP mode (its
``template`` endpoint on Triton's ``generate_stream``) and its chat mode on the frontend both
complete every request with the tokens asked for.

The commands run in an empty folder whose ``my-model`` is the tiny test model, with this
environment's ``bin/`` first on PATH and aiperf's after it. aiperf lives in an environment of its
own (it pins many packages): the test finds it on PATH or at ``$AIPERF`` and skips without it;
test_aiperf_requests_e2e.py checks the same requests without aiperf. Needs ports 8000 and 9000
free, as the doc's commands name them.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import jinja2
import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from openai_frontend.launcher.model_repo import shipped_model_dir
from python_backend.prompt.vllm_compat import VLLM_FIELDS
from tests.e2e.processes import port_free, wait_for

pytestmark = pytest.mark.e2e

REPO_ROOT = Path(__file__).resolve().parents[2]
DOC = REPO_ROOT / "docs" / "own-triton.md"
SECTION = "## Benchmarking with aiperf"
PORTS = (8000, 9000)
READY_URL = "http://127.0.0.1:9000/v1/models"
COMMAND_TIMEOUT_S = 600.0
REQUESTS = 8  # --request-count in the doc
OUTPUT_TOKENS = 16  # --output-tokens-mean, with ignore_eos


def doc_commands() -> list[str]:
    text = DOC.read_text(encoding="utf-8")
    section = text.split(SECTION, 1)[1].split("\n## ", 1)[0]
    return [block.strip() for block in re.findall(r"```bash\n(.*?)```", section, flags=re.DOTALL)]


def _argv(command: str) -> list[str]:
    return shlex.split(command)


def _option(argv: list[str], flag: str) -> list[str]:
    """The values after ``flag`` up to the next flag (aiperf's multi-value options)."""
    start = argv.index(flag) + 1
    end = next((i for i in range(start, len(argv)) if argv[i].startswith("--")), len(argv))
    return argv[start:end]


def _extra_inputs(argv: list[str]) -> dict[str, Any]:
    """aiperf's ``--extra-inputs``: JSON objects, or ``key:value`` pairs split at commas."""
    extra: dict[str, Any] = {}
    for item in _option(argv, "--extra-inputs"):
        if item.startswith("{"):
            extra.update(json.loads(item))
        else:
            for pair in item.split(","):
                key, _, value = pair.partition(":")
                extra[key] = value
    return extra


def _aiperf() -> Path | None:
    found = os.environ.get("AIPERF") or shutil.which("aiperf")
    return Path(found) if found and Path(found).is_file() else None


def test_the_doc_has_the_serve_and_both_aiperf_commands() -> None:
    commands = [_argv(command)[:2] for command in doc_commands()]
    assert commands == [["triton-chat", "serve"], ["aiperf", "profile"], ["aiperf", "profile"]]


def test_the_triton_template_renders_inputs_of_the_model_and_vllm_parameters() -> None:
    """What Triton gets from the doc's template: input names the shipped config.pbtxt declares,
    and request parameters the model reads as vLLM sampling parameters."""
    argv = _argv(doc_commands()[1])
    extra = _extra_inputs(argv)
    body = json.loads(
        jinja2.Environment(autoescape=True)
        .from_string(extra.pop("payload_template"))
        .render(text='a "quoted" prompt', max_tokens=OUTPUT_TOKENS)
    )
    assert extra.pop("response_field") == "text_output"
    body.update(extra)  # aiperf merges the other extra inputs into the body
    config = text_format.Parse((shipped_model_dir() / "config.pbtxt").read_text(), model_config_pb2.ModelConfig())
    inputs = {tensor.name for tensor in config.input}
    outputs = {tensor.name for tensor in config.output}
    assert {"text_input", "stream"} <= inputs and "text_output" in outputs
    assert set(body) - inputs <= VLLM_FIELDS
    assert body["text_input"] == 'a "quoted" prompt' and body["max_tokens"] == OUTPUT_TOKENS


@pytest.fixture
def user_folder(tmp_path: Path, tiny_model_dir: Path) -> Path:
    shutil.copytree(tiny_model_dir, tmp_path / "my-model")
    return tmp_path


def _summary(folder: Path) -> dict[str, Any]:
    data = json.loads((folder / "profile_export_aiperf.json").read_text())
    return data if isinstance(data, dict) else {}


def _metric(summary: dict[str, Any], name: str) -> Any:
    value = summary[name]
    return value.get("avg") if isinstance(value, dict) else value


def test_aiperf_drives_triton_and_the_frontend_as_the_doc_says(
    user_folder: Path, servers: list[subprocess.Popen[bytes]]
) -> None:
    aiperf = _aiperf()
    if aiperf is None:
        pytest.skip("aiperf is not installed (pip install aiperf in a venv; put it on PATH or set $AIPERF)")
    taken = [port for port in PORTS if not port_free(port)]
    if taken:
        pytest.skip(f"the doc's ports {taken} are taken on this machine")
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), str(aiperf.parent), env.get("PATH", "")])
    env["PYTHONPATH"] = str(REPO_ROOT)
    serve, *profiles = doc_commands()
    log_path = user_folder / "serve.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            ["bash", "-c", serve], cwd=user_folder, env=env, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
    servers.append(process)
    try:
        assert wait_for(process, READY_URL, timeout=COMMAND_TIMEOUT_S).status_code == 200
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{log_path.read_text(errors='replace')[-4000:]}") from exc

    for command in profiles:
        done = subprocess.run(
            ["bash", "-c", command], cwd=user_folder, env=env, capture_output=True, text=True,
            timeout=COMMAND_TIMEOUT_S, check=False,
        )  # fmt: skip
        assert done.returncode == 0, f"{command}\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
        summary = _summary(user_folder / _option(_argv(command), "--artifact-dir")[0])
        assert _metric(summary, "request_count") == REQUESTS, summary.get("error_summary")
        assert not summary.get("error_summary"), summary["error_summary"]
        # aiperf counts the output by tokenizing the text it got back with the model's tokenizer.
        assert _metric(summary, "output_sequence_length") >= OUTPUT_TOKENS / 2
        if "usage_completion_tokens" in summary:  # the chat endpoint: the server's own count
            assert _metric(summary, "usage_completion_tokens") == OUTPUT_TOKENS
