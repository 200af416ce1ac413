"""docs/performance.md holds the latest figures only: a table per CPU class and the commands.

The page grew into a diary of dated runs once; the project rule is that figures are replaced, never appended, and that
history lives in git. These checks keep the page short and free of the diary's marks: dates, "sittings" and paths of
the machine a run was taken on.
"""

from __future__ import annotations

import re
from pathlib import Path

PAGE = Path(__file__).resolve().parents[2] / "docs" / "performance.md"
MAX_LINES = 150
_DATE = re.compile(r"\b20\d\d-\d\d-\d\d\b")
_SITTING = re.compile(r"sitting", re.IGNORECASE)
_MACHINE_PATHS = ("/root/", "/tmp/", "/work/", "/home/")


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
