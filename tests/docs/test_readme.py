"""The README's first screen and its serve commands and flags, as a new user reads them.

The first screen (40 lines) says what triton-chat is and shows the two commands, serve and test,
and one sentence of performance that links to docs/performance.md; the figures themselves (ratios
such as 0.91×) live on that page only, so the two cannot disagree. Every ``scripts/serve.sh``
command the README shows is accepted by ``triton-chat serve``'s parser as written (a placeholder
``/path/to/NAME`` standing for a folder), and every flag the "Serving your own model" section
names is one that parser has. The "own Triton" commands run in tests/e2e/test_own_triton_e2e.py.
"""

from __future__ import annotations

import argparse
import re
import shlex
from pathlib import Path

import pytest

from openai_frontend.launcher.cli import build_parser, parse_serve_args

README = Path(__file__).resolve().parents[2] / "README.md"
FIRST_SCREEN = 40
SERVING = "## Serving your own model"
_FENCE = re.compile(r"```bash\n(.*?)```", re.DOTALL)
_RATIO = re.compile(r"\d\.\d+\s*×")
_FLAG = re.compile(r"(?<![\w/-])(--?[a-z][a-z0-9-]*)")
_PLACEHOLDER = re.compile(r"/path/to/[\w.-]+")


def _text() -> str:
    return README.read_text(encoding="utf-8")


def serve_commands() -> list[str]:
    return [
        line.strip()
        for block in _FENCE.findall(_text())
        for line in block.splitlines()
        if line.strip().startswith("scripts/serve.sh")
    ]


def _serve_flags() -> set[str]:
    parser = build_parser()
    (commands,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return set(commands.choices["serve"]._option_string_actions)


def test_the_first_screen_shows_what_it_is_the_two_commands_and_where_the_figures_are() -> None:
    first = "\n".join(_text().splitlines()[:FIRST_SCREEN])
    blocks = [block.strip() for block in _FENCE.findall(first)]
    assert "scripts/serve.sh" in blocks and "scripts/test.sh" in blocks
    assert "Triton Inference Server" in first and "/v1/chat/completions" in first
    assert "(docs/performance.md)" in first


def test_the_readme_quotes_no_ratios() -> None:
    ratios = [line for line in _text().splitlines() if _RATIO.search(line)]
    assert not ratios, "figures belong in docs/performance.md:\n" + "\n".join(ratios)


def test_the_readme_shows_serve_commands() -> None:
    assert "scripts/serve.sh" in serve_commands()
    assert any("--model" in command for command in serve_commands())


@pytest.mark.parametrize("command", serve_commands())
def test_a_serve_command_parses_as_written(command: str, tmp_path: Path) -> None:
    words = [str(tmp_path) if _PLACEHOLDER.fullmatch(word) else word for word in shlex.split(command)[1:]]
    options = parse_serve_args(["serve", *words])
    if "--model" in words:
        assert options.model == tmp_path


def test_every_flag_the_serving_section_names_is_a_serve_flag() -> None:
    section = _text().split(SERVING, 1)[1].split("\n## ", 1)[0]
    prose = re.sub(r"```.*?```", "", section, flags=re.DOTALL)
    spans = " ".join(re.findall(r"`([^`]+)`", prose))
    named = set(_FLAG.findall(spans))
    assert {"--max-num-seqs", "-tp", "--api-key"} <= named
    assert named - _serve_flags() == set(), "flags the README names that `triton-chat serve` does not have"
