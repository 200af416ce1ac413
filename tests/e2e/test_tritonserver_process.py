"""TritonServerProcess on the real tritonserver with a throwaway decoupled echo model.

Independent of the chat model: checks the binary preparation, the private Unix sockets, streaming
of a decoupled model, and that stopping (cleanly or by force) leaves no process, no socket and no
shared memory.
"""

from __future__ import annotations

import queue
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from openai_frontend.launcher.cache import cache_root
from openai_frontend.launcher.triton_install import locate_tritonserver
from openai_frontend.launcher.tritonserver import SHM_DIR, SHM_PREFIX, TritonServerError, TritonServerProcess
from tests.e2e.processes import group_pids

ECHO_CONFIG = """
backend: "python"
max_batch_size: 0
model_transaction_policy { decoupled: true }
input [ { name: "IN" data_type: TYPE_STRING dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_STRING dims: [ 1 ] } ]
instance_group [ { kind: KIND_CPU count: 1 } ]
"""

ECHO_MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            data = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            for i in range(3):
                out = pb_utils.Tensor("OUT", np.array([data[0] + str(i).encode()], dtype=np.object_))
                sender.send(pb_utils.InferenceResponse(output_tensors=[out]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""

BROKEN_MODEL = """
raise RuntimeError("this model refuses to load")
"""


def _repo(root: Path, model_code: str) -> Path:
    model = root / "echo"
    (model / "1").mkdir(parents=True)
    (model / "config.pbtxt").write_text(ECHO_CONFIG)
    (model / "1" / "model.py").write_text(model_code)
    return root


def _stream_echo(grpc_url: str, text: bytes) -> list[tuple[bytes | None, bool]]:
    responses: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client = grpcclient.InferenceServerClient(grpc_url)
    client.start_stream(callback=lambda result, error: responses.put((result, error)))
    try:
        tensor = grpcclient.InferInput("IN", [1], "BYTES")
        tensor.set_data_from_numpy(np.array([text], dtype=np.object_))
        client.async_stream_infer("echo", [tensor], enable_empty_final_response=True)
        seen: list[tuple[bytes | None, bool]] = []
        while True:
            result, error = responses.get(timeout=30)
            assert error is None, error
            final = result.get_response().parameters["triton_final_response"].bool_param
            out = result.as_numpy("OUT")
            seen.append((None if out is None else out[0], final))
            if final:
                return seen
    finally:
        client.stop_stream()
        client.close()


def _start(tmp_path: Path, model_code: str) -> TritonServerProcess:
    process = TritonServerProcess(locate_tritonserver(cache_root()), tmp_path / "tritonserver.log")
    process.start(_repo(tmp_path / "repo", model_code))
    return process


def _own_shm(process: TritonServerProcess) -> set[str]:
    return set(process._shm_regions)  # what stop() will clean up


def test_echo_model_streams_and_stops_cleanly(tmp_path: Path) -> None:
    process = _start(tmp_path, ECHO_MODEL)
    try:
        process.wait_ready(120, "echo")
        pgid = process.pid
        assert pgid is not None and len(group_pids(pgid)) >= 2  # the server and its stub
        endpoints = process.endpoints
        sockets = endpoints.sockets()
        assert all(path.is_socket() for path in sockets) and len(sockets) == 3
        assert sockets[0].parent.stat().st_mode & 0o777 == 0o700  # no other user may enter
        assert _stream_echo(endpoints.grpc_url, b"hi") == [
            (b"hi0", False),
            (b"hi1", False),
            (b"hi2", False),
            (None, True),
        ]
        regions = _own_shm(process)
        # The model's region is live; another one may be the finished auto-complete stub's.
        assert any((SHM_DIR / name).exists() for name in regions)
    finally:
        code = process.stop()
    assert code == 0
    assert group_pids(pgid) == []
    assert not any((SHM_DIR / name).exists() for name in regions)
    assert not sockets[0].parent.exists()
    assert process.stop() == 0  # idempotent


def test_forced_stop_kills_the_group_and_removes_its_shared_memory(tmp_path: Path) -> None:
    process = _start(tmp_path, ECHO_MODEL)
    try:
        process.wait_ready(120, "echo")
        pgid = process.pid
        assert pgid is not None
        regions = _own_shm(process)
        assert regions
    finally:
        # No grace period: SIGTERM then SIGKILL at once, as when the server hangs on shutdown.
        process.stop(timeout=0)
    assert group_pids(pgid) == []
    assert not any((SHM_DIR / name).exists() for name in regions)
    assert all(name.startswith(SHM_PREFIX) for name in regions)


def test_a_model_that_fails_to_load_reports_the_log(tmp_path: Path) -> None:
    process = _start(tmp_path, BROKEN_MODEL)
    try:
        with pytest.raises(TritonServerError, match="this model refuses to load"):
            process.wait_ready(120, "echo")
    finally:
        process.stop()
    assert process.pid is not None and group_pids(process.pid) == []
