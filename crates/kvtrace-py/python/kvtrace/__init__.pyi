"""Type stubs of the kvtrace package (see __init__.py for the documentation)."""

import os
from dataclasses import dataclass
from typing import Any, Dict, Iterable, List, Literal, Optional, Sequence, TypedDict, Union, overload

import pyarrow as pa

__version__: str

PathLike = Union[str, os.PathLike[str]]
View = Literal["records", "keys"]

class KvtraceError(Exception):
    """kvtrace's one-line message: file, byte offset or line, field."""

class OpFigures(TypedDict):
    count: int
    errors: int
    mean_ms: float
    p50_ms: float
    p90_ms: float
    p99_ms: float
    min_ms: float
    max_ms: float

class Info(TypedDict, total=False):
    file: str
    compressed: bool
    level: str
    format_version: int
    trace_schema_version: int
    lmcache_version: Optional[str]
    schema_variant: str
    duration_s: float
    t_wall_start: float
    first_record_t_mono: float
    last_record_t_mono: float
    startup_gap_s: float
    sm_config_digest: str
    digest_verified: bool
    config_canonical: bool
    semantic_digest: str
    recorded_config: Dict[str, Any]
    level_meta: Optional[Dict[str, Any]]
    total_records: int
    ops: Dict[str, int]
    distinct_keys: int
    payload: Dict[str, Any]
    undecodable_records: int
    truncated: Optional[Dict[str, Any]]
    interrupted: bool
    unfinished: Optional[Dict[str, Any]]
    warnings: List[str]
    trailer: Optional[Dict[str, Any]]
    bytes_read: int
    events: Optional[Dict[str, Any]]

class ReplayReport(TypedDict, total=False):
    duration_s: float
    ops: Dict[str, OpFigures]
    kvtrace: Dict[str, Any]

@dataclass
class Run:
    report: Dict[str, Any]
    tables: Dict[str, pa.Table]
    exit_code: int
    argv: List[str]

def columns(view: View = ...) -> List[str]: ...
@overload
def read(
    path: PathLike,
    columns: Optional[Sequence[str]] = ...,
    *,
    view: View = ...,
    batches: Literal[False] = ...,
    threads: int = ...,
    max_frame_bytes: Optional[int] = ...,
) -> pa.Table: ...
@overload
def read(
    path: PathLike,
    columns: Optional[Sequence[str]] = ...,
    *,
    view: View = ...,
    batches: Literal[True],
    threads: int = ...,
    max_frame_bytes: Optional[int] = ...,
) -> pa.RecordBatchReader: ...
def keys(path: PathLike, columns: Optional[Sequence[str]] = ..., **options: Any) -> Any: ...
def info(path: PathLike, *, threads: int = ...) -> Info: ...
def replay(paths: Union[PathLike, Iterable[PathLike]], **flags: Any) -> Run: ...
def sweep(engine: Literal["replay", "simulate"], path: PathLike, **flags: Any) -> Run: ...
