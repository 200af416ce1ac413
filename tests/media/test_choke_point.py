"""B9: one choke point. All URL, path and base64 media loading lives in ``openai_frontend/media``.

A static scan (``ast``, so comments and docstrings do not count) fails the build when a module of
the request-serving frontend opens files, URLs or images itself: ``open(...)``, ``os.open``,
``Image.open``, ``Path.read_bytes``/``read_text``/``.open()``, ``requests``, ``urllib.request``,
``httpx`` requests and clients, ``aiohttp``, raw socket connects (the vLLM PR #43117 lesson: a
processor that called ``requests.get``/``Image.open(path)`` itself bypassed the media policy).

Scope: every module of ``openai_frontend`` outside ``media/`` and ``launcher/``. The launcher runs
before any request (it reads its own config, log and model files and probes the tritonserver it
started); that it cannot see request data is itself checked: no serving module imports it. The
model side (``python_backend``) gets media as bytes and must never fetch: network calls are
forbidden there too.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
FRONTEND = REPO / "openai_frontend"
BACKEND = REPO / "python_backend"

FORBIDDEN_MODULES = {"requests", "urllib.request", "aiohttp", "httpx", "urllib3", "pycurl"}
NETWORK_CALLS = {"create_connection", "open_connection", "urlopen", "getaddrinfo", "AsyncClient", "Client"}
FILE_CALLS = {"read_bytes", "read_text", "open"}


def _dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return "?"


def violations(source: str, *, files: bool = True) -> list[str]:
    """What ``source`` does that only the media package may do (files too when ``files``)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [f"import {a.name}" for a in node.names if a.name in FORBIDDEN_MODULES]
        elif isinstance(node, ast.ImportFrom) and node.module in FORBIDDEN_MODULES:
            found.append(f"from {node.module} import")
        elif isinstance(node, ast.ImportFrom) and node.module == "PIL" and files:
            found.append("from PIL import")
        elif isinstance(node, ast.Call):
            name = _dotted(node.func)
            last = name.rsplit(".", 1)[-1]
            root = name.split(".", 1)[0]
            network = root in {"requests", "httpx", "urllib", "aiohttp"} or last in NETWORK_CALLS
            file_access = files and (name == "open" or last in FILE_CALLS)
            if network or file_access:
                found.append(f"{name}(...)")
    return found


def serving_modules() -> list[Path]:
    skip = (FRONTEND / "media", FRONTEND / "launcher")
    return sorted(p for p in FRONTEND.rglob("*.py") if not any(p.is_relative_to(s) for s in skip))


@pytest.mark.parametrize("path", serving_modules(), ids=lambda p: str(p.relative_to(REPO)))
def test_serving_module_loads_no_media_itself(path: Path) -> None:
    assert violations(path.read_text(encoding="utf-8")) == []


@pytest.mark.parametrize("path", sorted(BACKEND.rglob("*.py")), ids=lambda p: str(p.relative_to(REPO)))
def test_model_side_never_fetches(path: Path) -> None:
    assert violations(path.read_text(encoding="utf-8"), files=False) == []


def test_serving_modules_cannot_reach_the_launcher() -> None:
    for path in serving_modules() + sorted((FRONTEND / "media").rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        imported = [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
        imported += [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
        assert not any(name.startswith("openai_frontend.launcher") for name in imported), path


def test_the_scan_catches_each_pattern() -> None:
    samples = [
        "open(user_path)",
        "with open(p, 'rb') as f: pass",
        "os.open(p, 0)",
        "Image.open(p)",
        "PIL.Image.open(p)",
        "Path(p).read_bytes()",
        "path.read_text()",
        "path.open('rb')",
        "requests.get(url)",
        "import requests",
        "import urllib.request",
        "from urllib.request import urlopen",
        "urllib.request.urlopen(url)",
        "httpx.get(url)",
        "httpx.AsyncClient()",
        "import httpx",
        "import aiohttp",
        "from PIL import Image",
        "socket.create_connection((h, 80))",
        "asyncio.open_connection(h, 80)",
    ]
    for sample in samples:
        assert violations(sample), sample
    assert violations("docs = 'open(x) and requests.get(y)'  # Image.open(z)") == []
