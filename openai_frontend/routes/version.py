"""``GET /version``: the installed triton-chat version, as vLLM's ``/version`` answers it.

Owns: the answer ``{"version": ...}``, read from the installed package's metadata.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

from fastapi import APIRouter
from pydantic import BaseModel

router = APIRouter(tags=["version"])

DISTRIBUTION = "triton-chat"
UNKNOWN_VERSION = "unknown"  # a source tree run without being installed has no metadata


class VersionResponse(BaseModel):
    version: str


def package_version() -> str:
    try:
        return version(DISTRIBUTION)
    except PackageNotFoundError:
        return UNKNOWN_VERSION


@router.get("/version", responses={200: {"description": "the server's version"}})
async def server_version() -> VersionResponse:
    return VersionResponse(version=package_version())
