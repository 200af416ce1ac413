"""tritonserver started with a per-start secret: a local process without it cannot run inference
or register shared memory, on the gRPC port or the HTTP one; the launcher's calls still work."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from openai_frontend.launcher.cache import cache_root
from openai_frontend.launcher.triton_access import SECRET_HEADER, RestrictedAccess, version_problem
from openai_frontend.launcher.triton_install import locate_tritonserver
from openai_frontend.launcher.tritonserver import SHM_PREFIX, TritonServerProcess
from tests.e2e.test_tritonserver_process import ECHO_MODEL, _repo

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def restricted(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TritonServerProcess]:
    root = tmp_path_factory.mktemp("restricted")
    access = RestrictedAccess.for_frontend(api_keys=True)
    process = TritonServerProcess(locate_tritonserver(cache_root()), root / "tritonserver.log", access=access)
    process.start(_repo(root / "repo", ECHO_MODEL))
    try:
        process.wait_ready(120, "echo")  # the launcher's own readiness calls carry the secret
        yield process
    finally:
        process.stop()


def _echo_input() -> grpcclient.InferInput:
    tensor = grpcclient.InferInput("IN", [1], "BYTES")
    tensor.set_data_from_numpy(np.array([b"hi"], dtype=np.object_))
    return tensor


def _stub_region(process: TritonServerProcess) -> str:
    regions = sorted(process._shm_regions)  # the names any local process can read in the stub's argv
    assert regions and regions[0].startswith(SHM_PREFIX)
    return regions[0]


def _http(url: str, body: dict[str, object] | None, headers: dict[str, str] | None = None) -> int:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:  # noqa: S310 - loopback
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code


def test_without_the_secret_grpc_refuses_inference_and_shared_memory(restricted: TritonServerProcess) -> None:
    client = grpcclient.InferenceServerClient(restricted.endpoints.grpc_url)
    try:
        with pytest.raises(InferenceServerException, match="restricted|[Pp]ermission|authoriz"):
            client.infer("echo", [_echo_input()])
        with pytest.raises(InferenceServerException, match="restricted|[Pp]ermission|authoriz"):
            client.register_system_shared_memory("stolen", _stub_region(restricted), 1024)
        with pytest.raises(InferenceServerException):
            client.get_system_shared_memory_status()
        with pytest.raises(InferenceServerException):
            client.get_model_repository_index()
    finally:
        client.close()


def test_without_the_secret_http_refuses_inference_and_shared_memory(restricted: TritonServerProcess) -> None:
    base = restricted.endpoints.http_url
    assert _http(f"{base}/v2/models/echo/generate", {"IN": "hi"}) in (401, 403)
    register = {"key": _stub_region(restricted), "offset": 0, "byte_size": 1024}
    assert _http(f"{base}/v2/systemsharedmemory/region/stolen/register", register) in (401, 403)
    assert _http(f"{base}/v2/repository/index", {}) in (401, 403)
    assert _http(f"{base}/v2/health/ready", None) in (401, 403)
    wrong = {SECRET_HEADER: "not-the-secret"}
    assert _http(f"{base}/v2/systemsharedmemory/region/stolen/register", register, wrong) in (401, 403)


def test_with_the_secret_the_launcher_probes_and_reads_the_version(restricted: TritonServerProcess) -> None:
    assert restricted.access is not None
    client = grpcclient.InferenceServerClient(restricted.endpoints.grpc_url)
    try:
        with pytest.raises(InferenceServerException) as caught:
            client.infer("echo", [_echo_input()], headers=restricted.access.grpc_headers)
        # Past the check: only a decoupled model's refusal of a unary call is left.
        assert "restricted" not in str(caught.value).lower() and "decoupled" in str(caught.value).lower()
        status = client.get_system_shared_memory_status(headers=restricted.access.grpc_headers)
        assert status is not None
    finally:
        client.close()
    version = restricted.version()
    assert version is not None and version[0].isdigit()


def test_the_version_check_names_the_fixed_release() -> None:
    assert version_problem("2.59.1") is None and version_problem("2.61.0") is None
    problem = version_problem("2.51.0")
    assert problem is not None and "25.07" in problem and "CVE-2025-23319" in problem
