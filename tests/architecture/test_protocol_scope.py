"""``python_backend.protocol`` holds only what the frontend shares with the backend.

The protocol is the part of the backend that both processes import (tensor names, wire forms,
errors, parameters, settings); code that only the backend uses belongs to the backend package
that uses it, so that the frontend's side stays small and its rules stay the shared ones.
"""

from __future__ import annotations

from pathlib import Path

from tests.architecture.test_import_boundaries import ROOT, _module_name, _within, tree_imports

PROTOCOL = ROOT / "python_backend" / "protocol"


def protocol_modules() -> set[str]:
    """Every module of the protocol package, and each sub-package as one."""
    paths: list[Path] = [*PROTOCOL.glob("*.py"), *PROTOCOL.glob("*/__init__.py")]
    return {_module_name(path) for path in paths} - {"python_backend.protocol"}


def backend_only(modules: set[str], frontend_targets: set[str]) -> list[str]:
    return sorted(name for name in modules if not any(_within(target, name) for target in frontend_targets))


def test_every_protocol_module_is_imported_by_the_frontend_or_the_launcher() -> None:
    targets = {imp.target for imp in tree_imports("openai_frontend") if _within(imp.target, "python_backend.protocol")}
    assert backend_only(protocol_modules(), targets) == []


def test_a_module_the_frontend_does_not_import_is_reported() -> None:
    # The check itself: a protocol module no frontend import reaches is named.
    modules = {"python_backend.protocol.contract", "python_backend.protocol.backend_thing"}
    targets = {"python_backend.protocol.contract", "python_backend.protocol.contract.ChoiceDelta"}
    assert backend_only(modules, targets) == ["python_backend.protocol.backend_thing"]
