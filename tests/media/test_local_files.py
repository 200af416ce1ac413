"""B7: local files only under the media root; 0 opens outside it.

A ``sys.addaudithook`` hook (installed once per session, recording only while a test asks it to)
sees every ``open``/``os.open`` the process makes: an absolute path must be the root or below it,
a relative one (``openat`` from the root's descriptor) a single component that is not ``..``.
Over 30 vectors: traversal, absolute and ``file://`` escapes, NUL, symlinked files, directories and
devices, a symlink loop, a hard link to a file outside, a FIFO (must not hang), a character
device, a directory, an over-size file; and a symlink swapped in and out 1,000 times while files
are read.
"""

from __future__ import annotations

import asyncio
import os
import sys
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from media_harness import load, media_settings, refusal
from media_net import TestNet
from media_samples import jpeg, mp4, noisy_png, png

import openai_frontend.media.local as local
from python_backend.protocol.errors import ContractError

SECRET = png(3, 3, (9, 9, 9))  # lives outside the root; must never come back
GOOD = png()


@dataclass
class OpenAudit:
    """Records every path the process opens while ``active``."""

    active: bool = False
    paths: list[str] = field(default_factory=list)

    def hook(self, event: str, args: tuple[Any, ...]) -> None:
        if self.active and event == "open" and isinstance(args[0], (str, bytes)):
            self.paths.append(os.fsdecode(args[0]))

    def outside(self, root: Path) -> list[str]:
        prefix = str(root) + os.sep
        return [
            p
            for p in self.paths
            if (os.path.isabs(p) and p != str(root) and not p.startswith(prefix))
            or (not os.path.isabs(p) and (os.sep in p or p == ".."))
        ]


@pytest.fixture(scope="session")
def audit() -> OpenAudit:
    recorder = OpenAudit()
    sys.addaudithook(recorder.hook)  # hooks cannot be removed: one per session, gated by ``active``
    return recorder


@pytest.fixture
async def watched(audit: OpenAudit, media_root: Path, net: TestNet) -> AsyncIterator[OpenAudit]:
    await load(media_settings(media_root), net.network(), "demo.png")  # lazy imports happen before the window
    audit.paths.clear()
    audit.active = True
    try:
        yield audit
    finally:
        audit.active = False
    assert audit.outside(media_root) == []


@pytest.fixture
def tree(media_root: Path, tmp_path: Path) -> Path:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.png").write_bytes(SECRET)
    sibling = tmp_path / (media_root.name + "_evil")
    sibling.mkdir()
    (sibling / "x.png").write_bytes(SECRET)
    (media_root / "link.png").symlink_to(outside / "secret.png")
    (media_root / "linkdir").symlink_to(outside)
    (media_root / "zero.png").symlink_to("/dev/zero")
    (media_root / "loop.png").symlink_to(media_root / "loop.png")
    (media_root / "alias.png").symlink_to(media_root / "demo.png")
    os.link(outside / "secret.png", media_root / "hard.png")
    os.mkfifo(media_root / "pipe.png")
    (media_root / "dir.png").mkdir()
    (media_root / "big.png").write_bytes(noisy_png(64))
    try:
        os.mknod(media_root / "dev.png", 0o600 | 0o020000, os.makedev(1, 5))  # a /dev/zero twin
    except PermissionError:
        (media_root / "dev.png").symlink_to("/dev/zero")  # not root: the symlink variant still runs
    return outside


NOT_ALLOWED = "media_not_allowed"
UNAVAILABLE = "media_unavailable"
INVALID = "invalid_media_reference"

VECTORS: list[tuple[str, str]] = [
    ("../outside/secret.png", NOT_ALLOWED),
    ("sub/../../outside/secret.png", NOT_ALLOWED),
    ("sub/./../demo.png", NOT_ALLOWED),
    ("%2e%2e/outside/secret.png", UNAVAILABLE),
    ("..%2foutside%2fsecret.png", UNAVAILABLE),
    ("．．/outside/secret.png", UNAVAILABLE),
    ("/etc/passwd", NOT_ALLOWED),
    ("//etc/passwd", NOT_ALLOWED),
    ("/proc/self/environ", NOT_ALLOWED),
    ("{outside}/secret.png", NOT_ALLOWED),
    ("{root}/../outside/secret.png", NOT_ALLOWED),
    ("{root}_evil/x.png", NOT_ALLOWED),
    ("/", NOT_ALLOWED),
    ("{root}", INVALID),
    (".", INVALID),
    ("file:///etc/passwd", NOT_ALLOWED),
    ("file://../outside/secret.png", NOT_ALLOWED),
    ("file:///proc/self/root/etc/passwd", NOT_ALLOWED),
    ("file://host/share/secret.png", UNAVAILABLE),
    ("file://localhost/etc/passwd", UNAVAILABLE),
    ("demo.png\x00.jpg", INVALID),
    ("\x00", INVALID),
    ("link.png", UNAVAILABLE),
    ("linkdir/secret.png", UNAVAILABLE),
    ("zero.png", UNAVAILABLE),
    ("/dev/zero", NOT_ALLOWED),
    ("file:///dev/zero", NOT_ALLOWED),
    ("loop.png", UNAVAILABLE),
    ("alias.png", UNAVAILABLE),
    ("hard.png", UNAVAILABLE),
    ("pipe.png", UNAVAILABLE),
    ("dev.png", UNAVAILABLE),
    ("dir.png", UNAVAILABLE),
    ("sub", UNAVAILABLE),
    ("sub/", UNAVAILABLE),
    ("~/secret.png", UNAVAILABLE),
    ("missing.png", UNAVAILABLE),
    ("big.png", "media_too_large"),
]


def test_the_suite_has_at_least_30_vectors() -> None:
    assert len(VECTORS) >= 30


@pytest.mark.parametrize(("template", "code"), VECTORS, ids=[v for v, _ in VECTORS])
async def test_vector_is_refused_and_nothing_outside_is_opened(
    net: TestNet, media_root: Path, tree: Path, watched: OpenAudit, template: str, code: str
) -> None:
    value = template.replace("{root}", str(media_root)).replace("{outside}", str(tree))
    settings = media_settings(media_root, max_image_bytes=4096)
    info = await asyncio.wait_for(refusal(settings, net.network(), value), timeout=5)  # a FIFO must not hang
    assert info.code == code
    assert str(media_root) not in info.message and str(tree) not in info.message


@pytest.mark.parametrize(
    ("value", "part_type", "expected"),
    [
        ("demo.png", "image_url", png()),
        ("./demo.png", "image_url", png()),
        ({"url": "sub/inner.jpg"}, "image_url", jpeg()),
        ({"url": "file://demo.png"}, "image_url", png()),
        ({"url": "file://{root}/sub/inner.jpg"}, "image_url", jpeg()),
        ("{root}/demo.png", "image_url", png()),
        ({"url": "movie.mp4"}, "video_url", mp4()),
    ],
)
async def test_files_under_the_root_are_read(
    net: TestNet, media_root: Path, watched: OpenAudit, value: Any, part_type: str, expected: bytes
) -> None:
    if isinstance(value, dict):
        value = {"url": value["url"].replace("{root}", str(media_root))}
    else:
        value = value.replace("{root}", str(media_root))
    [(data, _)] = await load(media_settings(media_root), net.network(), value, part_type)
    assert data == expected
    assert watched.paths  # the hook did see the opens


async def test_symlink_swapped_during_reads_never_leaks_the_outside_file(
    net: TestNet, media_root: Path, tree: Path, audit: OpenAudit
) -> None:
    settings = media_settings(media_root)
    await load(settings, net.network(), "demo.png")  # lazy imports happen before the window
    race = media_root / "race.png"
    race.write_bytes(GOOD)
    stop = threading.Event()

    def swap() -> None:
        # Atomic renames: race.png is always either a regular file or a symlink to the secret.
        while not stop.is_set():
            (media_root / "race.tmp").symlink_to(tree / "secret.png")
            os.replace(media_root / "race.tmp", race)
            (media_root / "race.tmp").write_bytes(GOOD)
            os.replace(media_root / "race.tmp", race)

    swapper = threading.Thread(target=swap)
    outcomes = {"good": 0, "refused": 0}
    audit.paths.clear()
    audit.active = True
    swapper.start()
    try:
        for _ in range(1000):
            try:
                [(data, _)] = await load(settings, net.network(), "race.png")
            except ContractError as exc:
                assert exc.info.code == "media_unavailable"
                outcomes["refused"] += 1
            else:
                assert data == GOOD, "the file outside the root came back"
                outcomes["good"] += 1
    finally:
        stop.set()
        swapper.join()
        audit.active = False
    assert audit.outside(media_root) == []
    assert not any("secret" in p for p in audit.paths)
    assert outcomes["good"] > 0 and outcomes["refused"] > 0, outcomes  # the race really happened


async def test_control_without_nofollow_the_symlink_leaks(
    net: TestNet, media_root: Path, tree: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Sensitivity: the vectors above fail if ``O_NOFOLLOW`` or the link-count check go."""
    monkeypatch.setattr(local, "_check_opened", lambda fd, cap, shown: None)
    [(data, _)] = await load(media_settings(media_root), net.network(), "hard.png")
    assert data == SECRET
    await refusal(media_settings(media_root), net.network(), "link.png")  # O_NOFOLLOW still stops it
    monkeypatch.setattr(local, "_FILE_FLAGS", local._FILE_FLAGS & ~os.O_NOFOLLOW)
    [(data, _)] = await load(media_settings(media_root), net.network(), "link.png")
    assert data == SECRET
