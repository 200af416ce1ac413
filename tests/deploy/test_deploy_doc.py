"""Every command docs/deploy.md shows is checked as written.

``triton-chat`` commands are parsed by the launcher's parser, the ``vllm-router`` command by the
router's own parser and held against the command tests/e2e/test_router_e2e.py runs (same flags),
``kubectl apply -f`` names a manifest under deploy/ that validates, and the image and secret
commands name what the manifests use. A command of any other kind fails the test: it would go
unchecked."""

from __future__ import annotations

import ast
import re
import shlex
from pathlib import Path
from typing import Any

import pytest

from openai_frontend.launcher.cli import parse_args, parse_serve_args
from openai_frontend.launcher.options import ServeOptions
from tests.deploy.manifests import (
    DEPLOY,
    KUBERNETES_VERSIONS,
    REPO_ROOT,
    containers,
    manifests,
    pod_specs,
    validate,
)

PAGE = REPO_ROOT / "docs" / "deploy.md"
ROUTER_E2E = REPO_ROOT / "tests" / "e2e" / "test_router_e2e.py"
IMAGE = "triton-chat:0.1.0"
_FENCE = re.compile(r"```(bash|sh|shell|console)\n(.*?)```", re.DOTALL)


def page_commands() -> list[list[str]]:
    """Each command of the page's shell blocks, split as a shell splits it."""
    commands = []
    for _, block in _FENCE.findall(PAGE.read_text(encoding="utf-8")):
        for line in re.sub(r"\\\n\s*", " ", block).splitlines():
            if line.strip() and not line.strip().startswith("#"):
                commands.append(shlex.split(line))
    return commands


def _of(program: str, *first: str) -> list[list[str]]:
    return [c for c in page_commands() if c[0] == program and c[1 : 1 + len(first)] == list(first)]


def _flags(argv: list[str]) -> set[str]:
    return {word.split("=", 1)[0] for word in argv if word.startswith("--")}


def router_e2e_flags() -> set[str]:
    """The flags of the command the router e2e starts (the list it builds in ``_start_router``)."""
    tree = ast.parse(ROUTER_E2E.read_text(encoding="utf-8"))
    (function,) = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "_start_router"]
    (command,) = [
        n.value
        for n in ast.walk(function)
        if isinstance(n, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "cmd" for t in n.targets)
    ]
    assert isinstance(command, ast.List)
    return {str(e.value) for e in command.elts if isinstance(e, ast.Constant) and str(e.value).startswith("--")}


def router_e2e_policies() -> set[str]:
    tree = ast.parse(ROUTER_E2E.read_text(encoding="utf-8"))
    return {
        str(node.args[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == "router_for"
        and node.args
        and isinstance(node.args[0], ast.Constant)
    }


def test_every_command_on_the_page_is_of_a_kind_checked_here() -> None:
    known = {("triton-chat", "serve"), ("triton-chat", "worker"), ("vllm-router", None), ("kubectl", "apply")}
    known |= {("kubectl", "create"), ("docker", "build")}
    for command in page_commands():
        program = command[0]
        assert (program, command[1]) in known or (program, None) in known, f"unchecked command: {shlex.join(command)}"


def test_the_page_walks_from_one_machine_to_replicas_to_nodes() -> None:
    assert len(_of("triton-chat", "serve")) >= 4 and len(_of("vllm-router")) == 1
    assert any("--nnodes" in c for c in _of("triton-chat", "serve")) and _of("triton-chat", "worker")


@pytest.mark.parametrize("command", _of("triton-chat", "serve"), ids=shlex.join)
def test_serve_commands_parse(command: list[str]) -> None:
    assert isinstance(parse_serve_args(command[1:]), ServeOptions)


@pytest.mark.parametrize("command", _of("triton-chat", "worker"), ids=shlex.join)
def test_worker_commands_parse_and_join_node_0(command: list[str]) -> None:
    worker: Any = parse_args(command[1:])
    (leader,) = [c for c in _of("triton-chat", "serve") if "--nnodes" in c]
    serve = parse_serve_args(leader[1:])
    leader_values = {**serve.engine_flags, **serve.engine_overrides}
    for key in ("tensor_parallel_size", "nnodes", "master_addr", "master_port"):
        assert worker.values.get(key) == leader_values.get(key), key
    assert worker.values["node_rank"] == 1 and leader_values["node_rank"] == 0


def test_the_router_command_parses_and_is_the_one_the_router_e2e_runs() -> None:
    from vllm_router.launch_router import parse_router_args

    (command,) = _of("vllm-router")
    router = parse_router_args(command[1:])
    replicas = [c for c in _of("triton-chat", "serve") if "--nnodes" not in c and "--port" in c]
    ports = {c[c.index("--port") + 1] for c in replicas}
    assert {url.rsplit(":", 1)[1] for url in router.worker_urls} == ports
    assert _flags(command) == router_e2e_flags()
    assert router.policy in router_e2e_policies()


@pytest.mark.parametrize("command", _of("kubectl", "apply"), ids=shlex.join)
def test_kubectl_apply_names_a_manifest_that_validates(command: list[str]) -> None:
    assert command[2] == "-f" and len(command) == 4
    path = REPO_ROOT / command[3]
    assert path.parent == DEPLOY and path.is_file(), command[3]
    objects = [m for m in manifests() if m.file == path.name]
    assert objects
    for manifest in objects:
        validate(manifest, KUBERNETES_VERSIONS[0])


def test_every_manifest_is_applied_on_the_page() -> None:
    applied = {Path(c[3]).name for c in _of("kubectl", "apply")}
    assert applied == {path.name for path in DEPLOY.glob("*.yaml")}


def test_the_image_built_is_the_one_the_manifests_run() -> None:
    (command,) = _of("docker", "build")
    assert command[command.index("-f") + 1] == "deploy/Containerfile" and command[-1] == "."
    assert (REPO_ROOT / "deploy" / "Containerfile").is_file()
    image = command[command.index("-t") + 1]
    assert image == IMAGE and containers(IMAGE)
    # Every container of the project's own pods runs that image (the picker's Deployment is not ours).
    ours = [m for m in manifests() if m.kind in ("LeaderWorkerSet", "ServingRuntime") or m.file == "triton-chat.yaml"]
    images = {c["image"] for m in ours for pod in pod_specs(m) for c in pod["containers"]}
    assert images == {IMAGE}


def test_the_secret_created_is_the_one_the_pods_read() -> None:
    (command,) = _of("kubectl", "create")
    assert command[:4] == ["kubectl", "create", "secret", "generic"]
    name = command[4]
    key = command[5].removeprefix("--from-literal=").split("=", 1)[0]
    refs = [
        env["valueFrom"]["secretKeyRef"]
        for container in containers(IMAGE)
        for env in container.body.get("env", [])
        if env.get("name") == "TRITON_CHAT_API_KEY"
    ]
    assert refs and all((ref["name"], ref["key"]) == (name, key) for ref in refs)
