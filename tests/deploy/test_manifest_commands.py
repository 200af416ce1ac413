"""The commands inside deploy/'s manifests are accepted by the launcher's own parser, and what the
manifests say around them (ports, probes, grace period, autoscaling metric) matches the launcher.

A renamed or removed flag fails here, before a pod would crash-loop on it."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from openai_frontend.app import BACKEND_CLOSE_S
from openai_frontend.launcher.cache import cache_root
from openai_frontend.launcher.cli import parse_args, parse_serve_args
from openai_frontend.launcher.http_flags import DEFAULT_DRAIN_TIMEOUT_S
from openai_frontend.launcher.options import RepositoryOptions, ServeOptions, TritonServerArgs
from openai_frontend.launcher.triton_install import TritonInstallError, locate_tritonserver
from openai_frontend.launcher.tritonserver import STOP_TIMEOUT_S
from openai_frontend.routes.health import liveness, readiness
from openai_frontend.routes.health import router as health_router
from tests.deploy.manifests import Container, containers, expand, shell_commands, the

IMAGE = "triton-chat:0.1.0"
# What LeaderWorkerSet sets in each pod of a group of two (the worker is index 1).
LWS_ENV = {"LWS_LEADER_ADDRESS": "triton-chat-multinode-0.triton-chat-multinode", "LWS_WORKER_INDEX": "1"}
SERVING = [c for c in containers(IMAGE) if c.argv[1:2] == ["serve"]]


def _path_of(endpoint: Any) -> str:
    (path,) = [
        getattr(route, "path", "") for route in health_router.routes if getattr(route, "endpoint", None) is endpoint
    ]
    return str(path)


def _commands(container: Container) -> list[list[str]]:
    """The ``triton-chat`` command lines the container runs, ``$(VAR)`` expanded."""
    argv = [expand(word, LWS_ENV) for word in container.argv]
    if argv[:2] == ["/bin/sh", "-c"]:
        return shell_commands(argv[2])
    return [argv]


def _serve_options(container: Container) -> ServeOptions:
    (argv,) = _commands(container)
    return parse_serve_args(argv[1:])


def test_the_manifests_run_the_launcher() -> None:
    where = {c.where.split(":")[0] for c in containers(IMAGE)}
    assert {"triton-chat.yaml", "leaderworkerset.yaml", "kserve.yaml"} <= where
    assert len(SERVING) == 2  # the Deployment's pods and the LeaderWorkerSet's leader


@pytest.mark.parametrize("container", containers(IMAGE), ids=lambda c: c.where)
def test_every_command_parses_with_the_launchers_parser(container: Container) -> None:
    commands = _commands(container)
    assert commands and all(words[0] == "triton-chat" for words in commands), commands
    for words in commands:
        if words[1] == "serve":
            assert isinstance(parse_serve_args(words[1:]), ServeOptions)
        else:
            assert not isinstance(parse_args(words[1:]), ServeOptions)


@pytest.mark.parametrize("container", SERVING, ids=lambda c: c.where)
def test_the_frontend_listens_on_the_pods_port(container: Container) -> None:
    options = _serve_options(container)
    assert options.allow_external and options.host == "0.0.0.0"
    ports = {port["name"]: port["containerPort"] for port in container.body["ports"]}
    assert ports["http"] == options.port


@pytest.mark.parametrize("container", SERVING, ids=lambda c: c.where)
def test_the_probes_ask_the_frontends_health_routes(container: Container) -> None:
    probes = {name: container.body[name]["httpGet"] for name in ("startupProbe", "readinessProbe", "livenessProbe")}
    assert probes["readinessProbe"]["path"] == _path_of(readiness)
    # Liveness never waits on the model: a busy engine must not get its pod restarted.
    assert probes["livenessProbe"]["path"] == _path_of(liveness)
    assert probes["startupProbe"]["path"] == _path_of(liveness)
    assert {probe["port"] for probe in probes.values()} == {"http"}


@pytest.mark.parametrize("container", SERVING, ids=lambda c: c.where)
def test_the_startup_probe_waits_as_long_as_the_model_may_load(container: Container) -> None:
    # The frontend listens only once the model is ready, which may take up to --ready-timeout.
    startup = container.body["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] > _serve_options(container).ready_timeout_s


@pytest.mark.parametrize("container", SERVING, ids=lambda c: c.where)
def test_the_grace_period_covers_the_drain_and_tritonservers_stop(container: Container) -> None:
    options = _serve_options(container)
    # Not set in the manifests: the launcher's own default applies.
    assert "--drain-timeout" not in container.argv
    assert options.drain_timeout_s == DEFAULT_DRAIN_TIMEOUT_S
    pause = container.body["lifecycle"]["preStop"]["sleep"]["seconds"]
    # The preStop pause, the drain, the frontend's close of its Triton client, tritonserver's stop.
    needed = pause + options.drain_timeout_s + BACKEND_CLOSE_S + STOP_TIMEOUT_S
    assert container.pod["terminationGracePeriodSeconds"] >= needed


def test_the_autoscaler_scales_the_deployment() -> None:
    hpa, deployment = the("HorizontalPodAutoscaler").body, the("Deployment", "triton-chat.yaml").body
    target = hpa["spec"]["scaleTargetRef"]
    assert (target["kind"], target["name"]) == (deployment["kind"], deployment["metadata"]["name"])
    assert hpa["spec"]["minReplicas"] >= 2  # as the PodDisruptionBudget's maxUnavailable 1 assumes


def test_the_budget_and_the_services_select_the_pods_they_are_for() -> None:
    deployment = the("Deployment", "triton-chat.yaml").body
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert the("PodDisruptionBudget").body["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert the("Service", "triton-chat.yaml").body["spec"]["selector"].items() <= labels.items()
    assert the("InferencePool").body["spec"]["selector"]["matchLabels"].items() <= labels.items()


def test_the_leader_is_node_0_and_the_workers_share_its_engine_flags() -> None:
    lws = the("LeaderWorkerSet").body["spec"]["leaderWorkerTemplate"]
    leader = Container("leader", lws["leaderTemplate"]["spec"], lws["leaderTemplate"]["spec"]["containers"][0])
    worker = Container("worker", lws["workerTemplate"]["spec"], lws["workerTemplate"]["spec"]["containers"][0])
    serve = _serve_options(leader)
    leader_values = {**serve.engine_flags, **serve.engine_overrides}
    assert leader_values["nnodes"] == lws["size"] and leader_values["node_rank"] == 0
    for index in range(1, lws["size"]):
        (argv,) = [[expand(w, {**LWS_ENV, "LWS_WORKER_INDEX": str(index)}) for w in worker.argv]]
        node: Any = parse_args(argv[1:])
        assert node.values["node_rank"] == index
        shared = ("tensor_parallel_size", "nnodes", "master_addr", "master_port")
        assert {k: node.values.get(k) for k in shared} == {k: leader_values.get(k) for k in shared}
        assert node.model == serve.model


def test_kserve_writes_the_repository_tritonserver_serves() -> None:
    runtime = the("ServingRuntime").body
    (container,) = [c for c in containers(IMAGE) if c.where.startswith("kserve.yaml")]
    repository_words, tritonserver_words = _commands(container)
    repository = parse_args(repository_words[1:])
    tritonserver = parse_args(tritonserver_words[1:])
    assert isinstance(repository, RepositoryOptions) and isinstance(tritonserver, TritonServerArgs)
    args = tritonserver.args
    assert args[args.index("--model-repository") + 1] == str(repository.dest)
    # KServe puts the storageUri's content at /mnt/models; its v2 protocol is HTTP 8080, gRPC 9000.
    assert repository.model == Path("/mnt/models")
    assert args[args.index("--http-port") + 1] == "8080" and args[args.index("--grpc-port") + 1] == "9000"
    assert container.body["readinessProbe"]["httpGet"] == {"path": "/v2/health/ready", "port": 8080}
    port = runtime["spec"]["annotations"]["prometheus.kserve.io/port"]
    assert args[args.index("--metrics-port") + 1] == port
    formats = {(f["name"], f["version"]) for f in runtime["spec"]["supportedModelFormats"]}
    model = the("InferenceService").body["spec"]["predictor"]["model"]
    assert (model["modelFormat"]["name"], model["modelFormat"]["version"]) in formats
    assert model["runtime"] == runtime["metadata"]["name"]
    assert model["protocolVersion"] in runtime["spec"]["protocolVersions"]


def test_tritonserver_has_every_flag_kserve_passes() -> None:
    try:
        install = locate_tritonserver(cache_root())
    except TritonInstallError as exc:
        pytest.skip(f"no tritonserver here: {exc}")
    (container,) = [c for c in containers(IMAGE) if c.where.startswith("kserve.yaml")]
    _, tritonserver_words = _commands(container)
    done = subprocess.run(
        [str(install.server), "--help"], capture_output=True, text=True, env=install.environment(), timeout=60
    )
    usage = done.stdout + done.stderr
    flags = [word for word in tritonserver_words[2:] if word.startswith("--")]
    assert flags and all(flag in usage for flag in flags), usage[-2000:]


def test_the_image_is_built_from_the_readmes_triton_image() -> None:
    containerfile = (Path(__file__).resolve().parents[2] / "deploy" / "Containerfile").read_text(encoding="utf-8")
    (base,) = [line.split()[1] for line in containerfile.splitlines() if line.startswith("FROM ")]
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")
    assert f"-w /triton-chat {base}\n" in readme  # the container recipe's `docker run ... IMAGE`
