"""Every ``triton-chat serve`` command docs/configuration.md shows is accepted by the parser as written."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from openai_frontend.launcher.cli import parse_serve_args

PAGE = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"
_FENCE = re.compile(r"```(?:bash|sh|shell|console)?\n(.*?)```", re.DOTALL)


def serve_commands() -> list[str]:
    found = []
    for block in _FENCE.findall(PAGE.read_text(encoding="utf-8")):
        for line in re.sub(r"\\\n\s*", " ", block).splitlines():
            if line.strip().startswith("triton-chat serve"):
                found.append(line.strip())
    return found


def test_the_page_shows_a_serve_command() -> None:
    assert any("--speculative-config" in command for command in serve_commands())


@pytest.mark.parametrize("command", serve_commands())
def test_serve_command_parses_as_written(command: str, tmp_path: Path) -> None:
    words = [str(tmp_path) if word == "DIR" else word for word in shlex.split(command)[1:]]
    options = parse_serve_args(words)
    assert options.model == tmp_path
