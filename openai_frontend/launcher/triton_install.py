"""Finding the ``tritonserver`` binary: the one on PATH, else the one in the ``nvidia-pytriton`` wheel.

Owns ``TritonInstall`` (the binary, its backend folder and the environment it needs) and the
one-time preparation of the wheel's server. The wheel ships ``pytriton/tritonserver/`` (server,
Python backend) plus one Python-backend stub per Python version, and its shared libraries in
``nvidia_pytriton.libs``. The stub is the process that runs our model code, and it embeds the
Python it was built for, so the stub matching this interpreter is copied into
``backends/python/`` of a private copy of the server folder (the installed wheel may be
read-only and is shared by every Python version).
"""

from __future__ import annotations

import importlib.metadata
import logging
import os
import shutil
import sys
import sysconfig
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

logger = logging.getLogger(__name__)

PYTRITON_DISTRIBUTION = "nvidia-pytriton"
STUB_NAME = "triton_python_backend_stub"
# Written last into a prepared folder: a folder without it is an interrupted preparation.
READY_MARKER = ".triton-chat-ready"


class TritonInstallError(RuntimeError):
    """No usable tritonserver; the message says what to install."""


@dataclass(frozen=True)
class TritonInstall:
    """A runnable tritonserver and what it needs around it."""

    server: Path  # the tritonserver executable
    backend_dir: Path | None  # --backend-directory; None: the binary's built-in default
    env: dict[str, str] = field(default_factory=dict)  # variables to set (already merged with ours)

    def environment(self, base: dict[str, str] | None = None) -> dict[str, str]:
        """``base`` (default: this process's environment) with this install's variables applied."""
        merged = dict(os.environ if base is None else base)
        merged.update(self.env)
        return merged


def locate_tritonserver(cache_dir: Path) -> TritonInstall:
    """The ``tritonserver`` on PATH (e.g. the NGC container), else the pytriton wheel's, prepared once."""
    on_path = shutil.which("tritonserver")
    if on_path:
        # Its own installation knows where its backends are (/opt/tritonserver/backends).
        return TritonInstall(server=Path(on_path), backend_dir=None, env=_python_env())
    return prepare_wheel_install(cache_dir)


def prepare_wheel_install(cache_dir: Path) -> TritonInstall:
    """Copy the wheel's server into ``cache_dir`` with this Python's stub; reuse an earlier copy."""
    try:
        dist = importlib.metadata.distribution(PYTRITON_DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError as exc:
        raise TritonInstallError(
            "tritonserver is not on PATH and the nvidia-pytriton wheel is not installed; "
            f"run: {sys.executable} -m pip install 'triton-chat[model]' (the model extra: nvidia-pytriton, torch, ...) "
            "or use the NGC Triton container"
        ) from exc
    wheel_server = Path(str(dist.locate_file("pytriton/tritonserver")))
    libs = Path(str(dist.locate_file("nvidia_pytriton.libs")))
    python_tag = f"{sys.version_info.major}.{sys.version_info.minor}"
    stub = wheel_server / "python_backend_stubs" / python_tag / STUB_NAME
    if not (wheel_server / "bin" / "tritonserver").is_file():
        raise TritonInstallError(f"the nvidia-pytriton wheel has no tritonserver binary under {wheel_server}")
    if not stub.is_file():
        raise TritonInstallError(
            f"nvidia-pytriton {dist.version} has no Python-backend stub for Python {python_tag}; "
            "use a Python version it supports"
        )
    work = cache_dir / f"tritonserver-{dist.version}-py{python_tag}"
    if not (work / READY_MARKER).is_file():
        _build_work_folder(wheel_server, stub, work)
    env = _python_env(lib_dirs=(str(libs),))
    return TritonInstall(server=work / "bin" / "tritonserver", backend_dir=work / "backends", env=env)


def _build_work_folder(wheel_server: Path, stub: Path, work: Path) -> None:
    logger.info("preparing tritonserver from the nvidia-pytriton wheel in %s (once)", work)
    work.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{work.name}-", dir=work.parent))
    try:
        built = staging / "tritonserver"
        shutil.copytree(wheel_server, built, symlinks=True)
        shutil.copy2(stub, built / "backends" / "python" / STUB_NAME)
        (built / READY_MARKER).write_text("ok\n")
        if work.exists() and not (work / READY_MARKER).is_file():
            # Folders appear whole (by rename, marker inside), so one without the marker is
            # stale, e.g. copied by hand: replace it.
            shutil.rmtree(work)
        try:
            built.rename(work)
        except OSError:
            # Another launcher finished the same preparation first; use theirs.
            if not (work / READY_MARKER).is_file():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _python_env(lib_dirs: tuple[str, ...] = ()) -> dict[str, str]:
    """PATH and LD_LIBRARY_PATH that make the backend stub run this interpreter's Python.

    The stub's embedded Python finds its prefix through the ``python3`` on PATH; with the venv's
    ``bin/`` first it reads the venv's ``pyvenv.cfg`` and imports the venv's packages (numpy < 2,
    torch, transformers, this project). ``sys.executable`` is deliberately not resolved: in a
    venv it is a symlink whose directory is the venv, not the base installation.

    The stub links ``libpython3.X.so.1.0`` dynamically, and the system's copy may be an older
    patch release than the interpreter whose standard library it then loads: seen with Debian's
    3.11.2 library and pyenv's 3.11.7 ``_ssl`` module ("undefined symbol: _PyModule_Add", which
    breaks every ``import transformers``). So this interpreter's own shared library goes first
    on LD_LIBRARY_PATH, followed by ``lib_dirs``.
    """
    bin_dir = str(Path(sys.executable).parent)
    env = {"PATH": _prepend_path(bin_dir, os.environ.get("PATH", ""))}
    libraries = [d for d in (_libpython_dir(), *lib_dirs) if d]
    if libraries:
        rest = os.environ.get("LD_LIBRARY_PATH", "")
        for directory in reversed(libraries):
            rest = _prepend_path(directory, rest)
        env["LD_LIBRARY_PATH"] = rest
    return env


def _libpython_dir() -> str | None:
    """The folder holding this interpreter's ``libpython3.X.so``, if it was built shared."""
    if not sysconfig.get_config_var("Py_ENABLE_SHARED"):
        logger.warning(
            "this Python has no shared libpython; the backend stub will use the system's "
            "libpython%d.%d, which must match it",
            sys.version_info.major,
            sys.version_info.minor,
        )
        return None
    libdir = sysconfig.get_config_var("LIBDIR")
    soname = sysconfig.get_config_var("INSTSONAME") or sysconfig.get_config_var("LDLIBRARY")
    if libdir and soname and (Path(libdir) / soname).exists():
        return str(libdir)
    return None


def _prepend_path(first: str, rest: str) -> str:
    parts = [first, *(p for p in rest.split(os.pathsep) if p and p != first)]
    return os.pathsep.join(parts)
