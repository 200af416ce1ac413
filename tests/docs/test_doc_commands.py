"""Every benchmark command the README and docs show is accepted, as written, by its benchmark.

The benchmarks run for minutes on a quiet machine, so a test cannot run each to completion; what
goes stale silently is the command itself (a renamed flag, a module moved, a value out of range).
Each command found in a fenced shell block or an inline code span is parsed by the benchmark's own
argument parser, exactly as written; the run stops right after parsing. The commands that serve
(``triton-chat ...`` in the README) run for real in tests/e2e/test_own_triton_e2e.py, and the
configuration table's command in tests/launcher/test_config_docs.py.
"""

from __future__ import annotations

import argparse
import re
import runpy
import shlex
import sys
from pathlib import Path
from typing import Any, NoReturn

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
PAGES = [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").glob("*.md"))]
_FENCE = re.compile(r"```([\w-]*)\n(.*?)```", re.DOTALL)
_SHELL = {"", "bash", "sh", "shell", "console"}
_SPAN = re.compile(r"`([^`]+)`")
_MODULE = re.compile(r"-m (benchmarks\.[a-z_]+)")


class _Parsed(Exception):
    """Raised in place of running the benchmark, once its arguments are parsed."""

    def __init__(self, namespace: argparse.Namespace) -> None:
        super().__init__(namespace)
        self.namespace = namespace


def _fenced_commands(text: str) -> list[str]:
    commands: list[str] = []
    for language, block in _FENCE.findall(text):
        if language not in _SHELL:
            continue
        joined = re.sub(r"\\\n\s*", " ", block)
        for line in joined.splitlines():
            line = line.split(" #", 1)[0].strip()
            if line and not line.startswith("#") and _MODULE.search(line):
                commands.append(line)
    return commands


def benchmark_commands() -> list[tuple[str, str]]:
    """(page, command) for every ``-m benchmarks.X`` command the pages show."""
    found: list[tuple[str, str]] = []
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        spans = [" ".join(span.split()) for span in _SPAN.findall(_FENCE.sub("", text))]
        commands = _fenced_commands(text) + [s for s in spans if _MODULE.search(s)]
        found.extend((page.name, c) for c in dict.fromkeys(commands))
    return found


def _argv(command: str) -> tuple[str, list[str]]:
    words = shlex.split(command)
    at = words.index("-m")
    return words[at + 1], words[at + 2 :]


def parse_as_written(command: str, monkeypatch: pytest.MonkeyPatch) -> argparse.Namespace:
    """Run the command's benchmark module as ``python -m`` would, stopping after its arguments parse."""
    module, args = _argv(command)
    original = argparse.ArgumentParser.parse_args

    def parse_then_stop(self: argparse.ArgumentParser, *a: Any, **k: Any) -> NoReturn:
        raise _Parsed(original(self, *a, **k))

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parse_then_stop)
    monkeypatch.setattr(sys, "argv", [module, *args])
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except _Parsed as parsed:
        return parsed.namespace
    raise AssertionError(f"{module} ran without parsing its arguments")


def test_the_pages_show_benchmark_commands() -> None:
    modules = {_argv(c)[0] for _, c in benchmark_commands()}
    # The figures in docs/performance.md come from these; losing one from the page is a doc bug.
    assert {"benchmarks.compare", "benchmarks.serving_cost", "benchmarks.traffic"} <= modules


@pytest.mark.parametrize(("page", "command"), benchmark_commands(), ids=lambda v: v[:60])
def test_benchmark_command_parses_as_written(page: str, command: str, monkeypatch: pytest.MonkeyPatch) -> None:
    try:
        namespace = parse_as_written(command, monkeypatch)
    except SystemExit as exit_:
        pytest.fail(f"{page}: `{command}` is refused by its benchmark (exit {exit_.code})")
    assert vars(namespace), f"{page}: `{command}` parsed to nothing"


def test_a_stale_flag_is_caught(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        parse_as_written("python -m benchmarks.serving_cost --model DIR --no-such-flag 3", monkeypatch)
    assert exit_.value.code == 2
    assert "--no-such-flag" in capsys.readouterr().err
