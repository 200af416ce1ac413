"""docs/api.md's error table against the error catalogue (``python_backend.protocol.errors``).

Every code of the catalogue has a row, with the catalogue's status; every code the table names is
one the server sends (the catalogue's, or the media layer's family of 400s); the catalogue's plain
bad-field 400 (``code: null``) is the row that says "none". A new error kind without a row, or a
status changed on one side only, fails here.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from openai_frontend.media.errors import MediaFailure, too_many_media
from python_backend.protocol.errors import CATALOGUE, INVALID, ErrorKind

PAGE = Path(__file__).resolve().parents[2] / "docs" / "api.md"
SECTION = "## Errors"
_CODE = re.compile(r"`([a-z_]+)`")


def table_rows(text: str) -> list[tuple[int, str, list[str]]]:
    """(status, when, codes) for each row of the section's table, codes as the third column names them."""
    section = text.split(SECTION, 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[0].isdigit():
            rows.append((int(cells[0]), cells[1], _CODE.findall(cells[2])))
    return rows


def _rows() -> list[tuple[int, str, list[str]]]:
    return table_rows(PAGE.read_text(encoding="utf-8"))


def _statuses_by_code() -> dict[str, set[int]]:
    found: dict[str, set[int]] = {}
    for status, _when, codes in _rows():
        for code in codes:
            found.setdefault(code, set()).add(status)
    return found


def test_the_table_has_rows() -> None:
    assert len(_rows()) >= len(CATALOGUE) // 2


@pytest.mark.parametrize("kind", [k for k in CATALOGUE if k.code is not None], ids=lambda k: k.code)
def test_every_catalogued_code_has_a_row_with_its_status(kind: ErrorKind) -> None:
    code, status = kind.code, kind.status
    statuses = _statuses_by_code().get(code or "")
    assert statuses, f"docs/api.md's error table has no row for `{code}` ({status})"
    assert statuses == {status}, f"`{code}` is {status} in the catalogue, {sorted(statuses)} in docs/api.md"


def test_the_plain_bad_field_row_says_none() -> None:
    plain = [(status, codes) for status, _when, codes in _rows() if not codes]
    assert plain == [(INVALID.status, [])], "one row, the plain bad field's 400, has no code"


def test_every_code_in_the_table_is_one_the_server_sends() -> None:
    media = {failure.code for failure in MediaFailure} | {too_many_media(1).info.code}
    sent = {kind.code for kind in CATALOGUE} | media
    unknown = set(_statuses_by_code()) - sent
    assert not unknown, f"docs/api.md's error table names codes nothing sends: {sorted(unknown)}"


def test_a_missing_row_is_caught() -> None:
    text = PAGE.read_text(encoding="utf-8")
    without = "\n".join(line for line in text.splitlines() if "`engine_stalled`" not in line)
    codes = {code for _status, _when, found in table_rows(without) for code in found}
    assert "engine_stalled" not in codes and "overloaded" in codes
