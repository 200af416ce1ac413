"""Reading deploy/'s manifests, and validating each object the way the API server would.

Built-in kinds are checked with kubernetes-validate's strict schemas (an unknown field is an
error, as ``kubectl apply``'s default strict field validation makes it). Kinds that come with a
CRD (LeaderWorkerSet, KServe's ServingRuntime and InferenceService, the Inference Extension's
InferencePool) are checked against the CRD's own OpenAPI schema, kept in ``schemas/`` (see its
README), made strict the same way: an object schema that lists its properties and does not say
it keeps unknown fields refuses any other. Their ``metadata`` is checked as ObjectMeta.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import yaml
from referencing import Registry, Resource

REPO_ROOT = Path(__file__).resolve().parents[2]
DEPLOY = REPO_ROOT / "deploy"
SCHEMAS = Path(__file__).resolve().parent / "schemas"
# The oldest Kubernetes the manifests are for (a container's preStop `sleep` action is on by
# default from 1.30), and the newest kubernetes-validate knows.
KUBERNETES_VERSIONS = ("1.30", kubernetes_validate.latest_version())
_ENV_REFERENCE = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


@dataclass(frozen=True)
class Manifest:
    """One object of one file under deploy/."""

    file: str
    body: dict[str, Any]

    @property
    def kind(self) -> str:
        return str(self.body["kind"])

    @property
    def name(self) -> str:
        return str(self.body["metadata"]["name"])

    def __str__(self) -> str:
        return f"{self.file}: {self.kind}/{self.name}"


def manifest_files() -> list[Path]:
    return sorted(DEPLOY.glob("*.yaml"))


def manifests() -> list[Manifest]:
    found = []
    for path in manifest_files():
        for body in yaml.safe_load_all(path.read_text(encoding="utf-8")):
            if body is not None:
                found.append(Manifest(path.name, body))
    return found


def the(kind: str, file: str | None = None) -> Manifest:
    """The one object of ``kind`` (in ``file`` when given)."""
    (found,) = [m for m in manifests() if m.kind == kind and (file is None or m.file == file)]
    return found


# --- CRD kinds ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class CrdSchema:
    group: str
    version: str
    kind: str
    schema: dict[str, Any]

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}"


def strict(node: Any) -> Any:
    """``node`` with ``additionalProperties: false`` wherever an object schema lists its properties
    and neither allows more nor keeps unknown fields (``x-kubernetes-preserve-unknown-fields``)."""
    if isinstance(node, list):
        return [strict(item) for item in node]
    if not isinstance(node, dict):
        return node
    out = {key: (value if key in ("enum", "default", "required") else strict(value)) for key, value in node.items()}
    if (
        "properties" in out
        and "additionalProperties" not in out
        and not out.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    return out


@cache
def crd_schemas() -> dict[tuple[str, str], CrdSchema]:
    """(apiVersion, kind) -> the strict schema of every CRD kind in ``schemas/``."""
    found = {}
    for path in sorted(SCHEMAS.glob("*.json")):
        data = json.loads(path.read_text(encoding="utf-8"))
        crd = CrdSchema(data["group"], data["version"], data["kind"], strict(data["openAPIV3Schema"]))
        found[(crd.api_version, crd.kind)] = crd
    return found


def _schema_dir(version: str) -> str:
    """kubernetes-validate's strict schema folder for ``version`` (as its own ``validate`` picks it)."""
    known = [v for v in kubernetes_validate.utils.all_versions() if v.rsplit(".", 1)[0] <= version]
    return f"kubernetes-json-schema/v{known[-1]}-local-strict"


@cache
def _object_meta_validator(version: str) -> jsonschema.Validator:
    folder = _schema_dir(version)
    schema = kubernetes_validate.utils.schema_contents(f"{folder}/objectmeta-meta-v1.json", version)
    definitions = kubernetes_validate.utils.schema_contents(f"{folder}/_definitions.json", version)
    registry: Registry[Any] = Resource.from_contents(definitions) @ (Resource.from_contents(schema) @ Registry())
    return jsonschema.Draft202012Validator(schema, registry=registry)


def validate(manifest: Manifest, version: str) -> None:
    """Raise ``jsonschema.ValidationError`` (kubernetes-validate's for built-in kinds) when the API
    server would refuse the object; ``LookupError`` for a kind with no schema here."""
    body = manifest.body
    crd = crd_schemas().get((str(body.get("apiVersion")), str(body.get("kind"))))
    if crd is None:
        try:
            kubernetes_validate.validate(body, version, strict=True)
        except kubernetes_validate.SchemaNotFoundError as exc:
            raise LookupError(exc.message) from exc
        return
    jsonschema.Draft202012Validator(crd.schema).validate(body)
    _object_meta_validator(version).validate(body["metadata"])


# --- containers and their commands ----------------------------------------------------------------
@dataclass(frozen=True)
class Container:
    where: str  # e.g. "triton-chat.yaml: Deployment/triton-chat"
    pod: dict[str, Any]  # the pod spec holding it
    body: dict[str, Any]

    @property
    def argv(self) -> list[str]:
        """What runs: the image's entrypoint (``triton-chat``) when only ``args`` are given."""
        command = self.body.get("command")
        if command:
            return [*command, *self.body.get("args", [])]
        return ["triton-chat", *self.body.get("args", [])]


def pod_specs(manifest: Manifest) -> Iterator[dict[str, Any]]:
    """Every pod spec the object stands for (a LeaderWorkerSet has two; a ServingRuntime is one)."""
    spec = manifest.body.get("spec", {})
    if manifest.kind == "Deployment":
        yield spec["template"]["spec"]
    elif manifest.kind == "LeaderWorkerSet":
        template = spec["leaderWorkerTemplate"]
        yield template["leaderTemplate"]["spec"]
        yield template["workerTemplate"]["spec"]
    elif manifest.kind == "ServingRuntime":
        yield spec


def containers(image: str) -> list[Container]:
    """Every container of deploy/ that runs ``image``."""
    found = []
    for manifest in manifests():
        for pod in pod_specs(manifest):
            for body in pod.get("containers", []):
                if body.get("image") == image:
                    found.append(Container(str(manifest), pod, body))
    return found


def expand(word: str, env: dict[str, str]) -> str:
    """``$(VAR)`` replaced as the kubelet replaces it in a container's command and args."""
    return _ENV_REFERENCE.sub(lambda match: env.get(match[1], match[0]), word)


def shell_commands(script: str) -> list[list[str]]:
    """The commands of an ``sh -c`` script made of ``&&``-joined commands, ``exec`` dropped."""
    commands = []
    for part in script.split("&&"):
        words = shlex.split(part)
        commands.append(words[1:] if words[:1] == ["exec"] else words)
    return commands
