"""vLLM's ``--chat-template``, ``--tokenizer``, ``--seed`` and ``--max-logprobs`` as a user of
``triton-chat serve`` sees them, through the real tritonserver on the tiny model: the template
renders every chat prompt, the tokenizer comes from its own folder, sampled answers repeat across
a restart, and a request over the logprobs ceiling is a 400 naming the field."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from openai_frontend.launcher.network import free_port
from tests.e2e.test_smoke import _finish, _read_until

REPO_ROOT = Path(__file__).resolve().parents[2]
TEMPLATE = "{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}[assistant] "
SAMPLED: dict[str, Any] = {"model": "tiny", "temperature": 1.0, "top_p": 1.0, "max_tokens": 12, "ignore_eos": True}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")


def _command(port: int, *flags: str) -> list[str]:
    return [sys.executable, "-m", "openai_frontend.launcher", "serve", "--served-model-name", "tiny",
            "--port", str(port), "--device", "cpu", "--dtype", "float32", "--ready-timeout", "180", *flags]  # fmt: skip


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), env.get("PYTHONPATH", "")])
    return env


@contextmanager
def _serving(tmp_path: Path, *flags: str) -> Iterator[httpx.Client]:
    port = free_port()
    command = _command(port, "--triton-log", str(tmp_path / f"tritonserver-{port}.log"), *flags)
    # Its own session, like a terminal job: the launcher stops its tritonserver itself.
    launcher = subprocess.Popen(command, env=_env(), stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        _read_until(launcher, f"serving 'tiny' at http://127.0.0.1:{port}/v1", [], 300)
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=120) as http:
            yield http
    finally:
        _finish(launcher, signal.SIGINT, [])


def _split_folders(tiny_model_dir: Path, tmp_path: Path) -> tuple[Path, Path]:
    """The model folder without its tokenizer and template, and a folder with only those."""
    model, tokenizer = tmp_path / "model", tmp_path / "tokenizer"
    shutil.copytree(tiny_model_dir, model)
    tokenizer.mkdir()
    for name in TOKENIZER_FILES:
        if (model / name).is_file():
            shutil.move(str(model / name), str(tokenizer / name))
    return model, tokenizer


def _usage_error(*flags: str) -> subprocess.CompletedProcess[str]:
    command = _command(free_port(), *flags)
    return subprocess.run(command, env=_env(), capture_output=True, text=True, timeout=120, check=False)


def _chat(http: httpx.Client, content: str, **fields: Any) -> httpx.Response:
    return http.post(
        "/v1/chat/completions", json={**SAMPLED, "messages": [{"role": "user", "content": content}], **fields}
    )


def _sampled_texts(http: httpx.Client) -> list[str]:
    texts = []
    for content in ("tell me a story", "and another one"):
        reply = _chat(http, content)
        assert reply.status_code == 200, reply.text
        texts.append(reply.json()["choices"][0]["message"]["content"])
    return texts


def test_bad_template_and_tokenizer_stop_the_start_naming_the_flag(tiny_model_dir: Path, tmp_path: Path) -> None:
    broken = _usage_error("--model", str(tiny_model_dir), "--chat-template", "{% for m in messages %}")
    assert broken.returncode == 2 and "--chat-template: the template does not compile" in broken.stderr
    missing = _usage_error("--model", str(tiny_model_dir), "--chat-template", str(tmp_path / "nope.jinja"))
    assert missing.returncode == 2 and "--chat-template:" in missing.stderr and "cannot be read" in missing.stderr
    # Without --tokenizer, a model folder that has no tokenizer of its own is refused.
    model, _ = _split_folders(tiny_model_dir, tmp_path)
    alone = _usage_error("--model", str(model))
    assert alone.returncode != 0 and "has no tokenizer" in alone.stderr


def test_the_four_flags_as_a_user_sees_them(tiny_model_dir: Path, tmp_path: Path) -> None:
    model, tokenizer = _split_folders(tiny_model_dir, tmp_path)
    template = tmp_path / "template.jinja"
    template.write_text(TEMPLATE)
    flags = ["--model", str(model), "--tokenizer", str(tokenizer), "--chat-template", str(template)]
    flags += ["--seed", "1234", "--max-logprobs", "3"]
    with _serving(tmp_path, *flags) as http:
        # First, so that the restart below sees the same requests in the same order.
        first = _sampled_texts(http)

        # The prompt is the custom template's rendering, tokenized by the tokenizer folder's tokenizer.
        messages = [{"role": "user", "content": "hello there"}]
        counted = http.post("/tokenize", json={"model": "tiny", "messages": messages})
        assert counted.status_code == 200, counted.text
        tokens = counted.json()["tokens"]
        shown = http.post("/detokenize", json={"model": "tiny", "tokens": tokens}).json()["prompt"]
        assert shown == "[user] hello there\n[assistant] "
        reply = _chat(http, "hello there", max_tokens=2)
        assert reply.status_code == 200, reply.text
        assert reply.json()["usage"]["prompt_tokens"] == len(tokens)

        # --max-logprobs: over it is a 400 naming the field and the ceiling; at it, the alternatives come.
        over = _chat(http, "hi", logprobs=True, top_logprobs=4)
        assert over.status_code == 400, over.text
        assert over.json()["error"]["param"] == "top_logprobs" and "[0, 3]" in over.json()["error"]["message"]
        at = _chat(http, "hi", logprobs=True, top_logprobs=3, max_tokens=2)
        assert at.status_code == 200, at.text
        assert all(len(entry["top_logprobs"]) == 3 for entry in at.json()["choices"][0]["logprobs"]["content"])

    # --seed: the same sampled requests (no `seed` of their own) after a restart answer the same.
    with _serving(tmp_path, *flags) as http:
        assert _sampled_texts(http) == first
