"""Another local user gets nothing from ``serve`` but its frontend port: run as ``nobody``.

With the key in ``TRITON_CHAT_API_KEY`` and without a key, ``serve``'s processes (launcher,
tritonserver, the model's stub) carry no secret on a command line, listen on no TCP port but the
frontend's, tritonserver's Unix sockets cannot be opened and the stub's shared memory (every
request and response passes through it) cannot be read; through the frontend a keyed server
answers 401. The other user is a process started as ``nobody`` with the system's Python (the
project's interpreter may sit where ``nobody`` may not enter), reading what any local user can.
"""

from __future__ import annotations

import grp
import json
import os
import pwd
import re
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

from openai_frontend.launcher.tritonserver import SHM_PREFIX
from tests.e2e.processes import cmdline, descendants
from tests.e2e.test_smoke import _finish, _read_until, _start_launcher

pytestmark = pytest.mark.e2e

KEY = "local-user-test-key-0123456789"
OTHER_USER = "nobody"

# What the other user tries: read every command line and environment of serve's processes, read
# the stub's shared memory, open each Unix socket, call each TCP port of theirs (there should be
# none), and the frontend without a key.
PROBE = r"""
import json, socket, sys, urllib.error, urllib.request
job = json.loads(sys.argv[1])
seen = {"cmdlines": [], "environ_readable": [], "shm": {}, "sockets": {}, "ports": {}, "frontend": None}
for pid in job["pids"]:
    try:
        seen["cmdlines"].append(open(f"/proc/{pid}/cmdline", "rb").read().decode("utf-8", "replace"))
    except OSError:
        pass
    try:
        open(f"/proc/{pid}/environ", "rb").read()
        seen["environ_readable"].append(pid)
    except OSError:
        pass
for path in job["shm"]:
    try:
        open(path, "rb").read(1)
        seen["shm"][path] = "read"
    except OSError as exc:
        seen["shm"][path] = type(exc).__name__
for path in job["sockets"]:
    s = socket.socket(socket.AF_UNIX)
    try:
        s.connect(path)
        seen["sockets"][path] = "connected"
    except OSError as exc:
        seen["sockets"][path] = type(exc).__name__
    finally:
        s.close()
for port in job["ports"]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/health/ready", timeout=5) as r:
            seen["ports"][str(port)] = r.status
    except urllib.error.HTTPError as exc:
        seen["ports"][str(port)] = exc.code
    except OSError as exc:
        seen["ports"][str(port)] = type(exc).__name__
body = json.dumps({"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}).encode()
request = urllib.request.Request(f"http://127.0.0.1:{job['frontend']}/v1/chat/completions", data=body,
                                 headers={"Content-Type": "application/json"})
try:
    with urllib.request.urlopen(request, timeout=60) as r:
        seen["frontend"] = r.status
except urllib.error.HTTPError as exc:
    seen["frontend"] = exc.code
print(json.dumps(seen))
"""


def _as_other_user() -> list[str]:
    """The command prefix that runs a program as ``nobody:nogroup`` with no other groups.

    ``setpriv`` drops the ids, not ``subprocess.run(user=...)``: with ids to change, CPython
    forks instead of vforking, so the pytest process's gRPC fork handlers run in the child,
    where one restarted a poller that died on the descriptors the child closes (SIGABRT).
    """
    if os.geteuid() != 0:
        pytest.skip("running a process as another user needs root")
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("no setpriv on this machine")
    try:
        uid = pwd.getpwnam(OTHER_USER).pw_uid
        gid = grp.getgrnam("nogroup").gr_gid
    except KeyError:
        pytest.skip(f"no user {OTHER_USER!r} or group 'nogroup' on this machine")
    return [setpriv, f"--reuid={uid}", f"--regid={gid}", "--clear-groups", "--"]


def _other_user_python(as_other: list[str]) -> str:
    for candidate in ("/usr/bin/python3", "/usr/local/bin/python3", shutil.which("python3")):
        if candidate and os.access(candidate, os.X_OK) and _runs_as_other_user(as_other, candidate):
            return candidate
    pytest.skip(f"no Python that {OTHER_USER!r} may run")


def _runs_as_other_user(as_other: list[str], python: str) -> bool:
    done = subprocess.run([*as_other, python, "-c", "import os; assert os.getuid() != 0"], cwd="/", capture_output=True)
    return done.returncode == 0


def _tcp_listen_ports(pids: list[int]) -> set[int]:
    """The TCP ports these processes listen on (their socket inodes in /proc/net/tcp{,6})."""
    inodes: set[str] = set()
    for pid in pids:
        try:
            for fd in Path(f"/proc/{pid}/fd").iterdir():
                target = os.readlink(fd)
                if target.startswith("socket:["):
                    inodes.add(target[8:-1])
        except OSError:
            continue
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


@pytest.mark.parametrize("keyed", [True, False], ids=["key-in-environment", "no-key"])
def test_another_local_user_reaches_only_the_frontend(tiny_model_dir: Path, tmp_path: Path, keyed: bool) -> None:
    as_other = _as_other_user()
    python = _other_user_python(as_other)
    env = {"TRITON_CHAT_API_KEY": KEY} if keyed else {}
    launcher, port = _start_launcher(tiny_model_dir, tmp_path, env=env)
    lines: list[str] = []
    try:
        _read_until(launcher, f"serving 'tiny' at http://127.0.0.1:{port}/v1", lines)
        said = "".join(lines)
        found = re.search(r"tritonserver listens on gRPC unix:(\S+):0, HTTP http\+unix://(\S+), metrics "
                          r"http\+unix://(\S+)/metrics", said)  # fmt: skip
        assert found, said
        sockets = [f"{found[1]}:0", found[2], found[3]]
        assert all(Path(path).is_socket() for path in sockets)
        pids = descendants(launcher.pid)
        assert len(pids) >= 3, pids  # the launcher, tritonserver and the model's stub
        ports = _tcp_listen_ports(pids)
        assert ports == {port}, f"serve's processes listen on TCP {sorted(ports)}, not only the frontend's {port}"
        shm = sorted({f"/dev/shm/{arg}" for pid in pids for arg in cmdline(pid) if arg.startswith(SHM_PREFIX)})
        assert shm and all(Path(path).exists() for path in shm)  # the stub's requests and responses
        job = json.dumps({"pids": pids, "shm": shm, "sockets": sockets, "ports": [], "frontend": port})
        probe = subprocess.run(
            [*as_other, python, "-c", PROBE, job],
            cwd="/",
            env={"PATH": "/usr/bin:/bin"},
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert probe.returncode == 0, probe.stderr
        seen = json.loads(probe.stdout)
    finally:
        code = _finish(launcher, signal.SIGINT, lines)
    assert code == 0, "".join(lines)
    assert len(seen["cmdlines"]) >= 3
    for line in seen["cmdlines"]:
        assert "secret" not in line and "restricted" not in line and KEY not in line, line
    assert seen["environ_readable"] == []
    assert all(outcome == "PermissionError" for outcome in seen["sockets"].values()), seen["sockets"]
    assert all(outcome == "PermissionError" for outcome in seen["shm"].values()), seen["shm"]
    assert seen["frontend"] == (401 if keyed else 200)
