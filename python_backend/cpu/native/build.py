"""Compiling a C source of this package into a shared library once, and loading it.

Owns ``build_library`` and ``bind_functions`` (each dtype's C entry point, typed).
``build_library``: compile with the machine's C compiler (``$CC``, ``cc`` or ``gcc``) into the
user's cache, keyed by the source, the flags and the CPU (the libraries are built with
``-march=native``), reuse the file afterwards, and return None with the reason logged when there
is no compiler or the build fails, so every caller keeps a pure-PyTorch fallback. A compilation
is the start-up stage ``KERNEL`` (``protocol.start_events``), shown by the launcher: it takes
seconds, on a first start only.

The libraries link ``libgomp.so.1``: in a process where torch has loaded its own copy, the dynamic
loader reuses that one (same soname), so their parallel regions run on the calling thread's
OpenMP team, the same team torch uses on that thread.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from python_backend.protocol.start_events import KERNEL, StageReporter

logger = logging.getLogger(__name__)

Key = TypeVar("Key")
Kernel = TypeVar("Kernel")

FLAGS = ("-O3", "-march=native", "-fopenmp", "-ffast-math", "-fPIC", "-shared")
_BUILD_TIMEOUT_S = 120


def _cpu_identity() -> str:
    """The CPU model and feature flags: a library built with -march=native is only for this CPU."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return os.uname().machine
    wanted = [line for line in text.splitlines() if line.startswith(("model name", "flags"))]
    return "\n".join(sorted(set(wanted)))


def default_cache_dir() -> Path:
    """``native/`` in the launcher's cache: $TRITON_CHAT_CACHE, else $XDG_CACHE_HOME/triton-chat, else ~/.cache."""
    explicit = os.environ.get("TRITON_CHAT_CACHE")
    if explicit:
        return Path(explicit).expanduser() / "native"
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "triton-chat" / "native"


def build_library(source: Path, cache_dir: Path | None = None, extra_flags: tuple[str, ...] = ()) -> ctypes.CDLL | None:
    """Compile (or reuse) and load ``source``; None, with the reason logged, when it cannot be built.

    ``extra_flags`` follow ``FLAGS`` on the command line, so they can undo one (``-fno-fast-math``).
    """
    flags = (*FLAGS, *extra_flags)
    what = source.stem
    compiler = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    if compiler is None:
        logger.warning("no C compiler found (CC, cc, gcc): %s is not built", what)
        return None
    try:
        # The folder's headers too: a library is stale when a header it includes changed.
        text = b"".join(path.read_bytes() for path in (source, *sorted(source.parent.glob("*.h"))))
    except OSError as exc:  # an install without its package data
        logger.warning("%s is not built: its source is missing (%s)", what, exc)
        return None
    key = hashlib.sha256(text + " ".join((compiler, *flags)).encode() + _cpu_identity().encode()).hexdigest()[:16]
    folder = cache_dir or default_cache_dir()
    library = folder / f"{what}-{key}.so"
    if not library.is_file():
        stage = StageReporter(KERNEL)
        stage.begin(what)
        try:
            folder.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryDirectory(dir=folder) as scratch:
                built = Path(scratch) / library.name
                command = [compiler, *flags, "-o", str(built), str(source), "-lm"]
                result = subprocess.run(command, capture_output=True, text=True, timeout=_BUILD_TIMEOUT_S, check=False)
                if result.returncode != 0:
                    logger.warning("building %s failed:\n%s", what, result.stderr)
                    stage.failed(f"{what}: the compiler failed (see tritonserver's log)")
                    return None
                os.replace(built, library)  # atomic: a concurrent loader sees no half-written file
        except (OSError, subprocess.TimeoutExpired) as exc:
            logger.warning("building %s failed (%s)", what, exc)
            stage.failed(f"{what}: {exc}")
            return None
        logger.info("built %s", library)
        stage.end(what)
    try:
        return ctypes.CDLL(str(library))
    except OSError as exc:
        logger.warning("loading %s failed (%s)", library, exc)
        return None


def load_kernel(
    wrap: Callable[[ctypes.CDLL], Kernel],
    source: Path,
    cache_dir: Path | None,
    missing: str,
    extra_flags: tuple[str, ...] = (),
) -> Kernel | None:
    """``wrap`` of the library built from ``source``; None when it cannot be built, with the reason
    logged and then ``missing`` (what the model does without it) as a warning."""
    library = build_library(source, cache_dir, extra_flags)
    if library is None:
        logger.warning("%s", missing)
        return None
    return wrap(library)


def bind_functions(library: ctypes.CDLL, symbols: Mapping[Key, str], argtypes: Sequence[Any]) -> dict[Key, Any]:
    """Each key's (a dtype, or dtypes) entry point in ``library``, typed: ``argtypes`` as given, an
    int status returned."""
    functions: dict[Key, Any] = {}
    for dtype, symbol in symbols.items():
        function = getattr(library, symbol)
        function.restype = ctypes.c_int
        function.argtypes = list(argtypes)
        functions[dtype] = function
    return functions


def entry_address(function: Any) -> int:
    """The address of a loaded library's entry point, for a native driver that calls it directly."""
    address = ctypes.cast(function, ctypes.c_void_p).value
    if address is None:
        raise ValueError("a native entry point has no address")
    return address
