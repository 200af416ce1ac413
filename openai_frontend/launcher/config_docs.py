"""The settings tables of ``docs/configuration.md``, generated from where the settings are declared.

Owns rendering the ``config.json`` ServerConfig and ModelConfig tables and the ``config.pbtxt``
parameters table from ``FrontendSettings``' ``FlagInfo``, ``EngineSettings``' ``SettingInfo`` and
the launcher's own flags, and rewriting the marked regions of the docs page with them.

    python -m openai_frontend.launcher.config_docs [--check] [PATH]

writes the tables into PATH (default: the checkout's ``docs/configuration.md``); ``--check``
only exits 1 when the page differs from what it would write.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import Field, dataclass, fields
from pathlib import Path
from typing import Any

from openai_frontend.launcher.cli import build_parser
from openai_frontend.launcher.http_flags import frontend_flags
from python_backend.protocol.settings import EngineSettings, SettingInfo, setting_info, setting_kind

DOCS_PATH = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"
COMMAND = "python -m openai_frontend.launcher.config_docs"
_HEADER = "| key | default | flag | meaning |\n|---|---|---|---|"


@dataclass(frozen=True)
class LauncherRow:
    """A flag of the launcher itself (the listener, the supervisor): no settings class has it."""

    flag: str
    keys: str  # the ServerConfig key(s), as the table writes them; "" = none
    meaning: str
    default: str = ""  # "" = the flag's argparse default
    flags: str = ""  # the flag column when it names more than the flag


LISTENER_ROWS = (
    LauncherRow("--host", "`ipAddress`", "address to listen on"),
    LauncherRow("--port", "`port`", "port to listen on"),
    LauncherRow("--allow-external", "`allowAllZeroIpListening`", "needed for any address other machines can reach"),
    LauncherRow(
        "--ssl-certfile",
        "`httpsEnabled`, `tlsCert`, `tlsPk`",
        "HTTPS with this certificate and key (PEM)",
        default="off",
        flags="`--ssl-certfile`, `--ssl-keyfile` (`--tls-cert`, `--tls-key`)",
    ),
    LauncherRow(
        "--ssl-ca-certs",
        "`tlsCaCert`",
        "require client certificates signed by this CA (mutual TLS)",
        default="none",
        flags="`--ssl-ca-certs` (`--tls-ca-cert`)",
    ),
    LauncherRow(
        "--allowed-local-media-path",
        "",
        "the folder `file://` media parts are read from (`file://x.png` is `DIR/x.png`); nothing outside it, "
        "no symlinks (docs/media-security.md)",
    ),
    LauncherRow(
        "--log-level",
        "",
        "`debug`, `info`, `warning`, `error`, `critical`: the level of the launcher's, uvicorn's and the "
        "frontend's logs (the frontend's per-request info lines only at `debug`)",
        flags="`--log-level` (`--uvicorn-log-level`)",
    ),
)
SUPERVISOR_ROWS = (
    LauncherRow(
        "--drain-timeout",
        "",
        "seconds of graceful drain on SIGTERM: `/health/ready` and new inference requests answer 503 with "
        "`Retry-After` at once, requests in flight (streams included) finish, and the server stops when none is "
        "left or the time is up (streams still open then end with an error event, MindIE's `err_msg` or "
        "OpenAI's `error`, and `[DONE]`; one that sends nothing is cut about 2 s later). `0`: stop at once. "
        "SIGINT (Ctrl-C) and a second signal always stop at once",
    ),
    LauncherRow(
        "--max-restarts",
        "",
        "`serve` only: how many times in 10 minutes the launcher restarts tritonserver when the model's process "
        "dies, the server exits, or the model has not answered its readiness probe for 30 s (hung); past it the "
        "launcher stops with status 1. `0`: never restart",
    ),
    LauncherRow(
        "--triton-log-max-mb",
        "",
        "`serve` only: past this many MiB, tritonserver's log (`--triton-log`) is kept as `<log>.1` (the one "
        "before as `<log>.2`, older ones dropped) and started afresh, so a model that logs an error per request "
        "cannot fill the disk. `0`: never",
    ),
)


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _value(value: object) -> str:
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, float):
        return f"`{value:g}`"
    return f"`{value}`"


def _row(key: str, default: str, flag: str, meaning: str) -> str:
    return f"| {key or '—'} | {default} | {flag} | {_cell(meaning)} |"


def _switch_default(on: bool, has_key: bool) -> str:
    # A config.json key is true/false; a flag alone turns something on or off.
    return _value(on) if has_key else ("on" if on else "off")


def server_table() -> str:
    """ServerConfig: the listener's flags, then FrontendSettings', then the supervisor's."""
    defaults = vars(build_parser().parse_args(["serve"]))

    def launcher_row(row: LauncherRow) -> str:
        default = row.default or _value(defaults[row.flag.lstrip("-").replace("-", "_")])
        return _row(row.keys, default, row.flags or f"`{row.flag}`", row.meaning)

    lines = [launcher_row(row) for row in LISTENER_ROWS]
    for _, spec, info in frontend_flags():
        key = f"`{info.mindie_key}`" if info.mindie_key else ""
        if spec.annotation is bool:
            default = _switch_default(bool(spec.default), bool(info.mindie_key))
        else:
            default = _value(spec.get_default(call_default_factory=True))
        flag = f"`{info.flag}`" + (" (repeatable)" if spec.annotation == list[str] else "")
        lines.append(_row(key, default, flag, info.docs or str(spec.description)))
    lines += [launcher_row(row) for row in SUPERVISOR_ROWS]
    return "\n".join([_HEADER, *lines])


def model_table() -> str:
    """ModelConfig: every EngineSettings field that is a flag or a config.json key."""
    lines = []
    for spec in fields(EngineSettings):
        info = setting_info(spec)
        if info.flag is None and info.mindie_key is None:
            continue
        key = f"`{info.mindie_key}`" if info.mindie_key else ""
        if info.docs_default:
            default = info.docs_default
        elif setting_kind(spec) == "bool":
            default = _switch_default(bool(spec.default), info.mindie_key is not None)
        else:
            default = _value(spec.default)
        lines.append(_row(key, default, _flag_cell(spec, info), info.docs or info.help))
    return "\n".join([_HEADER, *lines])


def _flag_cell(spec: Field[Any], info: SettingInfo) -> str:
    """The flag column: the flag (vLLM's name where it has one), then its other names."""
    if not info.flag:
        return "—"
    if info.metavar and "=" in info.metavar:
        return f"`{info.flag} {info.metavar}` (several, or repeated; also `{'`, `'.join(info.aliases)}`)"
    names = [info.flag]
    if setting_kind(spec) == "bool" and not info.flag.startswith("--no-"):
        names.append("--no-" + info.flag[2:])
    cell = ", ".join(f"`{name}`" for name in names)
    others = [f"`{alias}`" for alias in info.aliases]
    if info.bytes_flag:
        others.append(f"`{info.bytes_flag}` in bytes")
    return f"{cell} ({', '.join(others)})" if others else cell


def parameters_table() -> str:
    """config.pbtxt: every EngineSettings field, by the name and value the model reads."""
    lines = ["| parameter | default | meaning |", "|---|---|---|"]
    for name, value in EngineSettings().to_parameters().items():
        spec = next(f for f in fields(EngineSettings) if f.name == name)
        info = setting_info(spec)
        # The docs text says what the setting does; a --no-X flag's help says what turning it off does.
        default = _value(value) if value else '`""`'
        lines.append(f"| `{name}` | {default} | {_cell(info.docs or info.help)} |")
    return "\n".join(lines)


TABLES: dict[str, Callable[[], str]] = {
    "server": server_table,
    "model": model_table,
    "parameters": parameters_table,
}


def render(page: str) -> str:
    """``page`` with each marked region replaced by its freshly generated table."""
    for name, table in TABLES.items():
        begin = f"<!-- begin generated: {name} ({COMMAND}) -->"
        end = f"<!-- end generated: {name} -->"
        start, stop = page.find(begin), page.find(end)
        if start < 0 or stop < start:
            raise ValueError(f"the page has no '{begin}' ... '{end}' region")
        page = f"{page[:start]}{begin}\n{table()}\n{page[stop:]}"
    return page


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=COMMAND, description="Write the settings tables of the configuration docs.")
    parser.add_argument("path", nargs="?", type=Path, default=DOCS_PATH, help="the page (default: %(default)s)")
    parser.add_argument("--check", action="store_true", help="only exit 1 when the page is out of date")
    args = parser.parse_args(argv)
    try:
        page = args.path.read_text(encoding="utf-8")
        fresh = render(page)
    except (OSError, ValueError) as exc:
        parser.error(str(exc))
    if args.check:
        if fresh != page:
            sys.stderr.write(f"{args.path} is out of date; run {COMMAND}\n")
            return 1
        return 0
    args.path.write_text(fresh, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
