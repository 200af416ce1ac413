"""Every object under deploy/ is one the API server accepts, field by field, with no unknown field."""

from __future__ import annotations

import copy

import jsonschema
import pytest

from tests.deploy.manifests import KUBERNETES_VERSIONS, Manifest, crd_schemas, manifests, the, validate

ALL = manifests()


def test_deploy_holds_each_kind_the_docs_promise() -> None:
    kinds = {m.kind for m in ALL}
    assert {
        "Deployment",
        "Service",
        "PodDisruptionBudget",
        "HorizontalPodAutoscaler",
        "PersistentVolumeClaim",
        "LeaderWorkerSet",
        "ServingRuntime",
        "InferenceService",
        "InferencePool",
    } <= kinds
    # Every CRD schema kept under schemas/ is used by some manifest: none is dead weight.
    assert {kind for _, kind in crd_schemas()} <= kinds


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("manifest", ALL, ids=str)
def test_the_api_server_would_accept_it(manifest: Manifest, version: str) -> None:
    validate(manifest, version)


def _misspell(body: dict, *path: str | int) -> dict:
    """``body`` with the last key of ``path`` renamed to something no schema knows."""
    broken = copy.deepcopy(body)
    node = broken
    for key in path[:-1]:
        node = node[key]
    node[f"{path[-1]}s"] = node.pop(path[-1])
    return broken


@pytest.mark.parametrize(
    ("kind", "path"),
    [
        ("Deployment", ("spec", "template", "spec", "containers", 0, "readinessProbe")),
        ("LeaderWorkerSet", ("spec", "leaderWorkerTemplate", "workerTemplate", "spec", "containers", 0, "args")),
        ("ServingRuntime", ("spec", "supportedModelFormats")),
        ("InferenceService", ("spec", "predictor", "model", "storageUri")),
        ("InferencePool", ("spec", "endpointPickerRef", "failureMode")),
        ("InferencePool", ("metadata", "labels")),
    ],
)
def test_a_misspelt_field_is_refused(kind: str, path: tuple[str | int, ...]) -> None:
    manifest = the(kind, "triton-chat.yaml") if kind == "Deployment" else the(kind)
    broken = Manifest(manifest.file, _misspell(manifest.body, *path))
    with pytest.raises(jsonschema.ValidationError):
        validate(broken, KUBERNETES_VERSIONS[0])


def test_a_wrong_type_in_a_crd_object_is_refused() -> None:
    manifest = the("LeaderWorkerSet")
    broken = copy.deepcopy(manifest.body)
    broken["spec"]["leaderWorkerTemplate"]["size"] = "two"
    with pytest.raises(jsonschema.ValidationError, match="'two' is not of type 'integer'"):
        validate(Manifest(manifest.file, broken), KUBERNETES_VERSIONS[0])


def test_a_kind_without_a_schema_is_an_error_not_a_pass() -> None:
    unknown = Manifest("x.yaml", {"apiVersion": "example.com/v1", "kind": "Nothing", "metadata": {"name": "x"}})
    with pytest.raises(LookupError):
        validate(unknown, KUBERNETES_VERSIONS[0])
