"""The package boundaries hold: who may import whom, read from every import statement in the tree.

The rules are the architecture: the frontend and the launcher use only the backend's ``protocol``;
``protocol`` is the standard library and numpy; only ``python_backend.triton`` talks to Triton's
Python backend; only ``openai_frontend.client`` talks gRPC; ``openai_frontend.completions`` builds
on ``openai_frontend.chat``, never the other way round; ``cpu`` sits below the engine and imports
only ``protocol`` of ours; requests enter the engine only through ``python_backend.intake``.
Imports inside functions count too.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("python_backend", "openai_frontend")


@dataclass(frozen=True)
class Import:
    module: str  # the importing module, dotted
    target: str  # the imported module, dotted (absolute)
    line: int


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_in(source: str, module: str) -> list[Import]:
    """Every import of ``source`` (module ``module``), at any depth; relative imports are refused."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [Import(module, alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                raise AssertionError(f"{module}:{node.lineno}: use absolute imports (the rules read them)")
            target = node.module or ""
            found.append(Import(module, target, node.lineno))
            # `from pkg import sub` imports pkg.sub when sub is a module of ours.
            found += [
                Import(module, f"{target}.{alias.name}", node.lineno)
                for alias in node.names
                if _is_our_module(f"{target}.{alias.name}")
            ]
    return found


def _is_our_module(dotted: str) -> bool:
    path = ROOT.joinpath(*dotted.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def tree_imports(*roots: str) -> list[Import]:
    return [
        imp
        for root in roots
        for path in sorted((ROOT / root).rglob("*.py"))
        for imp in imports_in(path.read_text(encoding="utf-8"), _module_name(path))
    ]


def _within(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def violations(
    imports: list[Import], importer: str, banned: tuple[str, ...], allowed: tuple[str, ...] = ()
) -> list[str]:
    return [
        f"{imp.module}:{imp.line} imports {imp.target}"
        for imp in imports
        if _within(imp.module, importer)
        and any(_within(imp.target, b) for b in banned)
        and not any(_within(imp.target, a) for a in allowed)
    ]


@pytest.fixture(scope="module")
def all_imports() -> list[Import]:
    return tree_imports(*PACKAGES, "benchmarks")


def test_the_frontend_and_launcher_use_only_the_protocol_of_the_backend(all_imports: list[Import]) -> None:
    assert violations(all_imports, "openai_frontend", ("python_backend",), ("python_backend.protocol",)) == []


def test_the_protocol_imports_the_standard_library_and_numpy_only(all_imports: list[Import]) -> None:
    ours_elsewhere = tuple(
        f"python_backend.{p}" for p in ("engine", "sampling", "text", "prompt", "model", "cpu", "parallel", "triton")
    )
    third_party = (
        "torch",
        "transformers",
        "tritonclient",
        "grpc",
        "fastapi",
        "pydantic",
        "starlette",
        "openai_frontend",
    )
    assert violations(all_imports, "python_backend.protocol", (*third_party, *ours_elsewhere)) == []
    stdlib = set(sys.stdlib_module_names) | {"numpy", "__future__"}
    foreign = [
        f"{imp.module}:{imp.line} imports {imp.target}"
        for imp in all_imports
        if _within(imp.module, "python_backend.protocol")
        and not _within(imp.target, "python_backend.protocol")
        and imp.target.split(".")[0] not in stdlib
    ]
    assert foreign == []


def test_only_the_triton_adapter_imports_the_python_backend_utils(all_imports: list[Import]) -> None:
    users = {imp.module for imp in all_imports if _within(imp.target, "triton_python_backend_utils")}
    assert users and all(_within(user, "python_backend.triton") for user in users), users


def test_the_engine_core_never_imports_the_adapter_or_the_frontend(all_imports: list[Import]) -> None:
    for core in ("engine", "sampling", "text", "prompt", "model", "cpu"):
        assert violations(all_imports, f"python_backend.{core}", ("python_backend.triton", "openai_frontend")) == []


def test_the_cpu_speed_paths_sit_below_the_engine(all_imports: list[Import]) -> None:
    # The engine and the model loader import cpu/; cpu/ imports nothing of theirs (its step inputs
    # take any transformers cache, not the engine's), so the two never import each other.
    banned = ("python_backend", "openai_frontend", "triton_python_backend_utils")
    allowed = ("python_backend.cpu", "python_backend.protocol")
    assert violations(all_imports, "python_backend.cpu", banned, allowed) == []
    assert any(
        _within(imp.target, "python_backend.cpu") for imp in all_imports if _within(imp.module, "python_backend.engine")
    )


def test_tensor_parallel_sits_above_the_engine_and_below_the_adapter(all_imports: list[Import]) -> None:
    # The engine is handed its group (engine/step_sync.py) and never imports it; the group never
    # imports the adapter, which starts it.
    for core in ("engine", "sampling", "text", "prompt", "model", "cpu"):
        assert violations(all_imports, f"python_backend.{core}", ("python_backend.parallel",)) == []
    banned = ("python_backend.triton", "openai_frontend", "triton_python_backend_utils")
    assert violations(all_imports, "python_backend.parallel", banned) == []
    assert any(
        _within(imp.target, "python_backend.parallel")
        for imp in all_imports
        if imp.module.startswith("python_backend.triton")
    )


def test_the_intake_is_the_one_way_in_above_the_engine(all_imports: list[Import]) -> None:
    # The engine never imports the intake, and the intake imports no transport; the adapter, the
    # tensor-parallel ranks and the benchmarks all build their requests through it.
    for core in ("engine", "sampling", "text", "prompt", "model", "cpu"):
        assert violations(all_imports, f"python_backend.{core}", ("python_backend.intake",)) == []
    banned = ("python_backend.parallel", "python_backend.triton", "openai_frontend", "triton_python_backend_utils")
    assert violations(all_imports, "python_backend.intake", banned) == []
    entering = {imp.module for imp in all_imports if _within(imp.target, "python_backend.intake")}
    for user in ("python_backend.triton", "python_backend.parallel", "benchmarks"):
        assert any(_within(module, user) for module in entering), user
    built_elsewhere = [
        f"{path.relative_to(ROOT)}:{node.lineno}"
        for root in (*PACKAGES, "benchmarks")
        for path in sorted((ROOT / root).rglob("*.py"))
        if not _within(_module_name(path), "python_backend.intake")
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.Call) and _called_name(node) == "EngineRequest"
    ]
    assert built_elsewhere == []


def _called_name(call: ast.Call) -> str:
    func = call.func
    return func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""


def test_the_scheduling_side_never_imports_the_execution_side(all_imports: list[Import]) -> None:
    # Scheduling state (request.py's RequestGroup) and execution state (execution.py's Execution)
    # live apart: what decides imports nothing of what runs, not even for the type checker.
    deciding = ("request", "scheduler", "admission")
    running = ("execution", "sequence", "steps", "prefill", "delivery", "batch_cache", "beam_search", "prefix_cache")
    for module in deciding:
        banned = tuple(f"python_backend.engine.{m}" for m in running)
        assert violations(all_imports, f"python_backend.engine.{module}", banned) == []


def test_only_the_frontend_client_imports_tritonclient_or_grpc(all_imports: list[Import]) -> None:
    users = {imp.module for imp in all_imports if _within(imp.target, "tritonclient") or _within(imp.target, "grpc")}
    assert users and all(_within(user, "openai_frontend.client") for user in users), users


def test_completions_build_on_chat_and_chat_knows_nothing_of_them(all_imports: list[Import]) -> None:
    # Completions reuse chat's steps and take no media; chat must not depend on its extension.
    banned = ("openai_frontend.media", "openai_frontend.client.triton", "openai_frontend.launcher")
    assert violations(all_imports, "openai_frontend.completions", banned) == []
    assert violations(all_imports, "openai_frontend.chat", ("openai_frontend.completions",)) == []
    assert any(
        _within(imp.target, "openai_frontend.chat")
        for imp in all_imports
        if _within(imp.module, "openai_frontend.completions")
    )


def test_the_rules_catch_a_forbidden_import() -> None:
    # The checker itself: a protocol module that imports torch (even inside a function), and a
    # frontend module that imports the engine, are both reported.
    found = imports_in("import numpy\n\ndef f():\n    import torch\n", "python_backend.protocol.bad")
    found += imports_in("from python_backend.engine import engine\n", "openai_frontend.bad")
    assert violations(found, "python_backend.protocol", ("torch",)) == ["python_backend.protocol.bad:4 imports torch"]
    assert violations(found, "openai_frontend", ("python_backend",), ("python_backend.protocol",)) == [
        "openai_frontend.bad:1 imports python_backend.engine",
        "openai_frontend.bad:1 imports python_backend.engine.engine",
    ]


def test_importing_the_frontend_app_loads_no_torch() -> None:
    code = (
        "import sys\n"
        "import openai_frontend.app, openai_frontend.launcher.cli\n"
        "heavy = sorted(m for m in ('torch', 'transformers', 'python_backend.engine') if m in sys.modules)\n"
        "print(','.join(heavy))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == ""
