"""tritonserver with listeners the user put on TCP ports: its administrative APIs (shared memory,
model repository) refuse a local process without the per-start secret, on the gRPC port and the
HTTP one, while inference, readiness and the version read need no secret (nothing is given it)."""

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
from openai_frontend.launcher.triton_endpoints import TritonListen
from openai_frontend.launcher.triton_install import locate_tritonserver
from openai_frontend.launcher.tritonserver import SHM_PREFIX, TritonServerProcess
from tests.e2e.test_tritonserver_process import ECHO_MODEL, _repo

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def restricted(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TritonServerProcess]:
    root = tmp_path_factory.mktemp("restricted")
    process = TritonServerProcess(
        locate_tritonserver(cache_root()), root / "tritonserver.log", access=RestrictedAccess()
    )
    process.start(_repo(root / "repo", ECHO_MODEL), listen=TritonListen.loopback())
    try:
        process.wait_ready(120, "echo")  # the launcher's readiness calls carry no secret
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


def test_without_the_secret_grpc_refuses_shared_memory_and_the_repository(restricted: TritonServerProcess) -> None:
    client = grpcclient.InferenceServerClient(restricted.endpoints.grpc_url)
    try:
        with pytest.raises(InferenceServerException, match="restricted|[Pp]ermission|authoriz"):
            client.register_system_shared_memory("stolen", _stub_region(restricted), 1024)
        with pytest.raises(InferenceServerException):
            client.get_system_shared_memory_status()
        with pytest.raises(InferenceServerException):
            client.get_model_repository_index()
        with pytest.raises(InferenceServerException) as caught:
            client.infer("echo", [_echo_input()])
        # Inference is not restricted: only a decoupled model's refusal of a unary call is left.
        assert "restricted" not in str(caught.value).lower() and "decoupled" in str(caught.value).lower()
    finally:
        client.close()


def test_without_the_secret_http_refuses_shared_memory_and_the_repository(restricted: TritonServerProcess) -> None:
    base = restricted.endpoints.http_url
    register = {"key": _stub_region(restricted), "offset": 0, "byte_size": 1024}
    assert _http(f"{base}/v2/systemsharedmemory/region/stolen/register", register) in (401, 403)
    assert _http(f"{base}/v2/repository/index", {}) in (401, 403)
    wrong = {SECRET_HEADER: "not-the-secret"}
    assert _http(f"{base}/v2/systemsharedmemory/region/stolen/register", register, wrong) in (401, 403)
    assert _http(f"{base}/v2/health/ready", None) == 200


def test_the_secret_opens_the_admin_apis_and_the_version_needs_none(restricted: TritonServerProcess) -> None:
    assert restricted.access is not None
    client = grpcclient.InferenceServerClient(restricted.endpoints.grpc_url)
    try:
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
