"""Every ``triton-chat serve`` and ``triton-chat worker`` command docs/tensor-parallel.md shows is
accepted by the launcher's parser as written, environment variables included, and the several-node
example means what the page says: 16 ranks over 2 nodes of 8, node 1 holding ranks 8-15."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from openai_frontend.launcher.cli import parse_args
from openai_frontend.launcher.options import ServeOptions, engine_settings
from openai_frontend.launcher.worker import WorkerOptions, worker_settings
from python_backend.protocol.settings import EngineSettings

PAGE = Path(__file__).resolve().parents[2] / "docs" / "tensor-parallel.md"
_ASSIGNMENT = re.compile(r"^[A-Z_][A-Z0-9_]*=")


def _shell_blocks() -> list[str]:
    """The text of each ```bash fence, in order."""
    blocks: list[str] = []
    current: list[str] | None = None
    for line in PAGE.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            if current is not None:
                blocks.append("\n".join(current))
                current = None
            elif line.strip() == "```bash":
                current = []
        elif current is not None:
            current.append(line)
    return blocks


def commands() -> list[str]:
    found = []
    for block in _shell_blocks():
        for line in re.sub(r"\\\n\s*", " ", block).splitlines():
            words = shlex.split(line, comments=True)
            program = [w for w in words if not _ASSIGNMENT.match(w)][:1]
            if program == ["triton-chat"]:
                found.append(line.strip())
    return found


def _settings(command: str, monkeypatch: pytest.MonkeyPatch) -> EngineSettings:
    for name in ("NNODES", "PET_NNODES", "GROUP_WORLD_SIZE", "NODE_RANK", "GROUP_RANK", "PET_NODE_RANK"):
        monkeypatch.delenv(name, raising=False)
    for name in ("MASTER_ADDR", "PET_MASTER_ADDR", "MASTER_PORT", "PET_MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    words = shlex.split(command)
    while _ASSIGNMENT.match(words[0]):
        name, _, value = words.pop(0).partition("=")
        monkeypatch.setenv(name, value)
    options = parse_args(words[1:])
    if isinstance(options, WorkerOptions):
        return worker_settings(options, Path("/models/llama3-70b"))
    assert isinstance(options, ServeOptions)
    return engine_settings(options, Path("/models/llama3-70b"), "llama3-70b")


def test_the_page_shows_both_nodes_and_the_environment_form() -> None:
    shown = commands()
    assert sum(c.startswith("triton-chat serve") for c in shown) >= 1
    assert sum(" triton-chat worker" in f" {c}" for c in shown) >= 2
    assert any(c.startswith("NNODES=") for c in shown)


@pytest.mark.parametrize("command", commands())
def test_each_command_parses_as_written(command: str, monkeypatch: pytest.MonkeyPatch) -> None:
    settings = _settings(command, monkeypatch)
    assert (settings.tensor_parallel_size, settings.nnodes, settings.ranks_per_node) == (16, 2, 8)
    assert (settings.master_addr, settings.master_port) == ("10.0.0.1", 29500)
    expected_first = 0 if "serve" in command else 8
    assert settings.first_rank == expected_first
