"""docs/tensor-contract.md's tensor tables say what contract.INPUT_SPECS / OUTPUT_SPECS declare."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from python_backend.protocol import contract

DOC = Path(__file__).resolve().parents[2] / "docs" / "tensor-contract.md"


def table_rows(section: str) -> list[tuple[str, str, tuple[int, ...]]]:
    """(name, datatype, dims) of each tensor that the table under the heading starting ``## section``
    lists; a row may name several."""
    text = DOC.read_text(encoding="utf-8")
    body = text.split(f"\n## {section}", 1)[1].split("\n## ", 1)[0]
    lines = body.split("\n")
    header = lines.index("| name | type | shape | meaning |")
    rows = []
    for line in lines[header + 2 :]:
        if not line.startswith("|"):
            break  # the table ends at its first line that is not a row
        names, datatype, shape = (cell.strip() for cell in line.strip("|").split(" | ")[:3])
        dims = tuple(int(d) for d in shape.strip("[]").split(","))
        rows += [(name, datatype, dims) for name in re.findall(r"`([a-z_]+)`", names)]
    return rows


def spec_rows(specs: tuple[contract.TensorSpec, ...]) -> list[tuple[str, str, tuple[int, ...]]]:
    return [(s.name, s.datatype, s.dims) for s in specs]


@pytest.mark.parametrize(("section", "specs"), [("Inputs", contract.INPUT_SPECS), ("Outputs", contract.OUTPUT_SPECS)])
def test_the_docs_table_lists_every_tensor_with_its_type_and_shape_in_order(
    section: str, specs: tuple[contract.TensorSpec, ...]
) -> None:
    assert table_rows(section) == spec_rows(specs)


def test_the_table_reader_sees_a_wrong_type() -> None:
    # The check itself: a row that says INT32 where the contract says BYTES does not match.
    rows = table_rows("Inputs")
    wrong = [(name, "INT32" if name == contract.MESSAGES else datatype, dims) for name, datatype, dims in rows]
    assert wrong != spec_rows(contract.INPUT_SPECS)
    assert (contract.MESSAGES, "BYTES", (1,)) in rows
