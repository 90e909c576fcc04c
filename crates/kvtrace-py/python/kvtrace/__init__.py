"""kvtrace from Python: LMCache storage traces as Arrow tables, and kvtrace's reports as dicts.

``read`` streams any trace kvtrace reads (every LMCT variant, ``.lct.zst``, events level) into
a ``pyarrow.Table`` -- one row per record, or with ``view="keys"`` one row per key -- or, with
``batches=True``, a ``pyarrow.RecordBatchReader`` for traces larger than memory. polars and
pandas take either through Arrow (``polars.from_arrow``, ``Table.to_pandas``), DuckDB queries
them by name. ``info`` returns ``kvtrace info``'s figures; ``replay`` and ``sweep`` run the
``kvtrace`` command this package installs and return its report with its tables as Arrow.

Every failure is a ``KvtraceError`` whose message is kvtrace's one line (file, byte offset or
line, field).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sysconfig
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional, Sequence, Union

import pyarrow as pa
import pyarrow.parquet as pq

from ._native import KvtraceError, __version__
from ._native import info_json as _info_json
from ._native import open_stream as _open_stream
from ._native import view_columns as _view_columns

__all__ = [
    "KvtraceError",
    "Run",
    "__version__",
    "columns",
    "info",
    "keys",
    "read",
    "replay",
    "sweep",
]

PathLike = Union[str, "os.PathLike[str]"]


def columns(view: str = "records") -> List[str]:
    """Every column of ``view`` ("records" or "keys"), in schema order."""
    return list(_view_columns(view)[0])


def _message(error: BaseException) -> str:
    """kvtrace's line out of an Arrow error raised while streaming."""
    text = str(error)
    for prefix in ("External error: ",):
        at = text.find(prefix)
        if at >= 0:
            text = text[at + len(prefix):]
    return text.strip()


def read(
    path: PathLike,
    columns: Optional[Sequence[str]] = None,
    *,
    view: str = "records",
    batches: bool = False,
    threads: int = 0,
    max_frame_bytes: Optional[int] = None,
) -> Union[pa.Table, pa.RecordBatchReader]:
    """Reads a trace as Arrow.

    ``columns`` picks columns by name (default: every column but ``args``, the call's
    arguments as ``kvtrace dump`` shows them, which is the costliest to build). ``view`` is
    "records" (one row per frame after the header) or "keys" (one row per key a call names).
    With ``batches=True`` the result is a ``RecordBatchReader`` that decodes a few batches
    ahead of the consumer, so memory stays bounded whatever the trace's size. ``threads``:
    decoding threads (0: one per core).
    """
    stream = _open_stream(
        os.fspath(path),
        view,
        None if columns is None else list(columns),
        threads,
        max_frame_bytes,
    )
    reader = pa.RecordBatchReader.from_stream(stream)
    if batches:
        return reader
    try:
        return reader.read_all()
    except pa.ArrowException as e:
        raise KvtraceError(_message(e)) from None


def keys(path: PathLike, columns: Optional[Sequence[str]] = None, **options: Any):
    """``read(path, columns, view="keys")``: one row per key of every call."""
    return read(path, columns, view="keys", **options)


def info(path: PathLike, *, threads: int = 0) -> Dict[str, Any]:
    """``kvtrace info --json``'s figures of one trace, as a dict."""
    return json.loads(_info_json(os.fspath(path), threads))


@dataclass
class Run:
    """What a ``replay`` or ``sweep`` returned: the JSON report, its tables as Arrow (by the
    CSV table's name without prefix and extension: ``requests``, ``points``, ...), and the
    command's exit status (1 when a replay had failed calls: the report is still whole)."""

    report: Dict[str, Any]
    tables: Dict[str, pa.Table] = field(default_factory=dict)
    exit_code: int = 0
    argv: List[str] = field(default_factory=list)


def _binary() -> str:
    """The kvtrace command: $KVTRACE_BIN, the one installed with this package, or PATH's."""
    named = os.environ.get("KVTRACE_BIN")
    if named:
        return named
    beside = Path(sysconfig.get_path("scripts")) / "kvtrace"
    if beside.is_file():
        return str(beside)
    found = shutil.which("kvtrace")
    if found:
        return found
    raise KvtraceError("the kvtrace command is not installed beside this package (set KVTRACE_BIN)")


def _flags(options: Dict[str, Any]) -> List[str]:
    """Keyword arguments as the command's flags: ``l1_size_gb=2`` is ``--l1-size-gb 2``,
    ``True`` a bare flag, ``False`` or ``None`` nothing, a list a comma-separated value."""
    out: List[str] = []
    for name, value in options.items():
        flag = "--" + name.replace("_", "-")
        if value is None or value is False:
            continue
        if value is True:
            out.append(flag)
        elif isinstance(value, (list, tuple)):
            out += [flag, ",".join(str(v) for v in value)]
        else:
            out += [flag, str(value)]
    return out


def _run(argv: List[str], report: Path, tables: Path, prefixes: Sequence[str]) -> Run:
    done = subprocess.run(argv, capture_output=True, text=True)
    if not report.is_file():
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        message = lines[-1] if lines else f"kvtrace exited with status {done.returncode}"
        if message.startswith("kvtrace: "):
            message = message[len("kvtrace: "):]
        raise KvtraceError(message)
    run = Run(report=json.loads(report.read_text()), exit_code=done.returncode, argv=argv)
    for file in sorted(tables.glob("*.parquet")):
        name = file.stem
        for prefix in prefixes:
            if name.startswith(prefix):
                name = name[len(prefix):]
        run.tables[name] = pq.read_table(file)
    return run


def replay(paths: Union[PathLike, Iterable[PathLike]], **flags: Any) -> Run:
    """Runs ``kvtrace replay`` on one trace (or an events fleet's files) with ``flags``
    (``l1_size_gb=2, eviction_policy="LRU"``) and returns its JSON report and its tables
    (``requests``, ``ops``, ``tiers``, ``tier_io``, ``divergences``)."""
    files = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
    with tempfile.TemporaryDirectory(prefix="kvtrace-") as scratch:
        out = Path(scratch)
        report = out / "report.json"
        argv = [_binary(), "replay", *map(os.fspath, files), *_flags(flags)]
        argv += ["--output-dir", str(out), "--no-csv", f"--json={report}", "--parquet", "-q"]
        return _run(argv, report, out, ("trace_replay_", "events_replay_"))


def sweep(engine: str, path: PathLike, **flags: Any) -> Run:
    """Runs ``kvtrace sweep ENGINE PATH`` (engine "replay" or "simulate"; a list value is an
    axis: ``l1_size_gb=[0.5, 1, 2]``) and returns its JSON report and its tables (``points``
    and the figures' tables)."""
    with tempfile.TemporaryDirectory(prefix="kvtrace-") as scratch:
        out = Path(scratch)
        report = out / "sweep.json"
        argv = [_binary(), "sweep", engine, os.fspath(path), *_flags(flags)]
        argv += [f"--json={report}", f"--parquet={out}", "-q"]
        return _run(argv, report, out, ("sweep_",))
