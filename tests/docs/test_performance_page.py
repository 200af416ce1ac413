"""docs/performance.md holds the latest figures only: a table per CPU class and the commands.

The page grew into a diary of dated runs once; the project rule is that figures are replaced, never appended, and that
history lives in git. These checks keep the page short and free of the diary's marks: dates, "sittings" and paths of
the machine a run was taken on; its commands name vLLM's venv as a user types it (``$VLLM_VENV``). No page a user reads
(README.md, docs/*.md) names a path of an author's machine.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
PAGE = REPO_ROOT / "docs" / "performance.md"
USER_PAGES = [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").glob("*.md"))]
MAX_LINES = 150
_DATE = re.compile(r"\b20\d\d-\d\d-\d\d\b")
_SITTING = re.compile(r"sitting", re.IGNORECASE)
_MACHINE_PATHS = ("/root/", "/tmp/", "/work/", "/home/")
# Home folders and checkouts of the machines the project was written on; /tmp/ may be a product path elsewhere.
_AUTHOR_PATHS = re.compile(r"(?<![\w.~])/(?:root|work|home|Users)/")
_BARE_VENV = re.compile(r"(?<![$\w])VLLM_VENV\b")


def _lines() -> list[str]:
    return PAGE.read_text(encoding="utf-8").splitlines()


def test_the_page_is_at_most_150_lines() -> None:
    lines = _lines()
    assert len(lines) <= MAX_LINES, f"docs/performance.md has {len(lines)} lines; replace figures, do not append runs"


def test_the_page_has_no_dates() -> None:
    dated = [f"{n}: {line}" for n, line in enumerate(_lines(), 1) if _DATE.search(line)]
    assert not dated, "dates belong in git history, not on the page:\n" + "\n".join(dated)


def test_the_page_has_no_sittings() -> None:
    diary = [f"{n}: {line}" for n, line in enumerate(_lines(), 1) if _SITTING.search(line)]
    assert not diary, "the page keeps the latest figures, not a diary of sittings:\n" + "\n".join(diary)


def test_the_page_has_no_machine_paths() -> None:
    found = [f"{n}: {line}" for n, line in enumerate(_lines(), 1) if any(p in line for p in _MACHINE_PATHS)]
    assert not found, "commands take placeholders such as --model DIR, not paths of a machine:\n" + "\n".join(found)


def test_the_commands_name_vllms_venv_as_a_variable() -> None:
    bare = [
        f"{n}: {line}" for n, line in enumerate(_lines(), 1) if _BARE_VENV.search(line.replace("export VLLM_VENV", ""))
    ]
    assert not bare, "write $VLLM_VENV, as a user types it:\n" + "\n".join(bare)


@pytest.mark.parametrize("page", USER_PAGES, ids=lambda page: page.name)
def test_no_page_names_an_authors_paths(page: Path) -> None:
    lines = page.read_text(encoding="utf-8").splitlines()
    found = [f"{n}: {line}" for n, line in enumerate(lines, 1) if _AUTHOR_PATHS.search(line)]
    assert not found, f"{page.name} names paths of a machine; use placeholders (DIR, $VLLM_VENV, ~/...):\n" + "\n".join(
        found
    )


def test_an_authors_path_is_caught() -> None:
    assert _AUTHOR_PATHS.search("--model /work/models/qwen")
    assert _AUTHOR_PATHS.search("see /home/alice/x")
    assert not _AUTHOR_PATHS.search("~/.cache/triton-chat and https://example.com/home/ and docs/work/x")
