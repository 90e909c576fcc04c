"""The kvtrace wheel as a notebook user meets it: run by .ci/run in a fresh venv with the wheel,
pyarrow, polars, DuckDB and pandas from PyPI. Expectations come from the `kvtrace` command's own
text outputs (dump, info, CSV), parsed here, not from the module under test."""

import json
import os
import resource
import subprocess
from pathlib import Path

import duckdb
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

import kvtrace

REPO = Path(__file__).resolve().parents[3]
SHARED = REPO.parent / "shared" / "lmcache"
SAMPLES = [REPO / "testdata/lmcache" / f"{n}.lct" for n in ("basic_lru", "basic_lru.truncated", "unknown_qualname")]
CHURN = REPO / "testdata/lmcache/churn/lru_seed1.lct"


def cli(*args):
    done = subprocess.run(["kvtrace", *map(str, args)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return done.stdout


def dumped(path):
    return [json.loads(line) for line in cli("dump", "--no-header", path).splitlines()]


def keys_of(args):
    """The chunk hashes a call names, from dump's JSON."""
    if "keys" in args:
        return [k["chunk_hash"] for k in args["keys"]]
    if "spec" in args:
        return [k["chunk_hash"] for g in args["spec"]["key_groups"] for k in g["keys"]]
    return [e["key"]["chunk_hash_hex"] for e in args.get("entries", [])]


def shared(name):
    path = SHARED / name
    if not path.exists():
        pytest.skip("../shared is absent (fresh clone); this check runs in CI")
    return path


def traces():
    out = SAMPLES + [CHURN]
    if SHARED.is_dir():
        out += [SHARED / "churn_lru.lct", SHARED / "events_churn.lct"]
    return out


@pytest.mark.parametrize("path", traces(), ids=lambda p: p.name)
def test_the_arrow_table_equals_dumps_records_field_by_field(path):
    table = kvtrace.read(path, columns=kvtrace.columns("records"))
    rows = table.to_pylist()
    want = dumped(path)
    assert len(rows) == len(want)
    for got, exp in zip(rows, want):
        for name in ("frame", "offset", "len"):
            assert got[name] == exp[name]
        if "undecodable" in exp:
            assert got["undecodable"] == exp["undecodable"] and got["qualname"] is None
            continue
        assert got["t_mono"] == exp["t_mono"] and got["t_wall"] == exp["t_wall"]
        assert got["qualname"] == exp["qualname"]
        assert json.loads(got["args"]) == exp["args"]
        assert got["request_id"] == exp["args"].get("external_request_id")
        assert [k.hex() for k in got["keys"]] == keys_of(exp["args"])
        assert got["num_keys"] == len(got["keys"])
    assert table.schema.metadata[b"kvtrace.view"] == b"records"


def test_a_compressed_trace_reads_as_its_plain_self(tmp_path):
    zst = tmp_path / "t.lct.zst"
    cli("convert", CHURN, zst)
    assert kvtrace.read(zst, kvtrace.columns()).equals(kvtrace.read(CHURN, kvtrace.columns()))


def test_the_keys_view_has_one_row_per_key():
    keys = kvtrace.keys(CHURN, ["frame", "position", "chunk_hash", "kv_rank"])
    want = [(r["frame"], i, h) for r in dumped(CHURN) for i, h in enumerate(keys_of(r["args"]))]
    got = [(r["frame"], r["position"], r["chunk_hash"].hex()) for r in keys.to_pylist()]
    assert got == want
    assert set(keys.column("kv_rank").to_pylist()) == {16777472}


def test_info_is_the_commands_json():
    for path in traces():
        got = kvtrace.info(path)
        want = json.loads(cli("info", "--json", path))[0]
        assert got == want


def test_polars_pandas_and_duckdb_read_the_same_figures(tmp_path):
    path = shared("churn_lru.lct")
    parquet = tmp_path / "t.parquet"
    cli("convert", path, parquet)
    ops = {q: n for q, n in kvtrace.info(path)["ops"].items()}
    # pyarrow
    t = pq.read_table(parquet)
    by_call = t.group_by("qualname").aggregate([("frame", "count")])
    assert dict(zip(by_call["qualname"].to_pylist(), by_call["frame_count"].to_pylist())) == ops
    # polars, from the file and from the streamed table
    df = pl.read_parquet(parquet)
    counted = df.group_by("qualname").len()
    assert dict(zip(counted["qualname"], counted["len"])) == ops
    assert pl.from_arrow(kvtrace.read(path)).shape == df.shape
    # DuckDB on the file
    distinct = duckdb.sql(f"select count(distinct chunk_hash) from (select unnest(keys) as chunk_hash from '{parquet}')").fetchall()[0][0]
    assert distinct == kvtrace.info(path)["distinct_keys"]
    # pandas
    assert int(t.to_pandas()["num_keys"].sum()) == len(kvtrace.keys(path, ["frame"]))


def test_replay_returns_its_report_and_tables():
    run = kvtrace.replay(CHURN, l1_size_gb=0.004, eviction_policy="LRU")
    assert run.exit_code == 0
    assert set(run.tables) >= {"requests", "ops", "tiers", "tier_io", "divergences"}
    hits = run.report["kvtrace"]["hits"]
    assert run.tables["requests"].num_rows == hits["requests"]
    csv_dir = Path(run.argv[run.argv.index("--output-dir") + 1])
    assert not csv_dir.exists(), "the scratch directory is removed"
    assert pa.types.is_unsigned_integer(run.tables["requests"].schema.field("requested_chunks").type)


def test_sweep_returns_its_points():
    run = kvtrace.sweep("replay", CHURN, l1_size_gb=[0.002, 0.004, 0.008])
    points = run.tables["points"]
    assert points.num_rows == 3
    assert len(run.report["points"]) == 3


def test_errors_are_kvtrace_errors_with_the_one_line(tmp_path):
    with pytest.raises(kvtrace.KvtraceError, match="nope.lct: cannot open"):
        kvtrace.read(tmp_path / "nope.lct")
    with pytest.raises(kvtrace.KvtraceError, match='column "nope"'):
        kvtrace.read(CHURN, ["frame", "nope"])
    with pytest.raises(ValueError):
        kvtrace.read(CHURN, view="frames")
    bytes_ = bytearray((SAMPLES[0]).read_bytes())
    third = dumped(SAMPLES[0])[2]["offset"]
    bytes_[third:third + 4] = b"\xff\xff\xff\xff"
    bad = tmp_path / "bad.lct"
    bad.write_bytes(bytes_)
    with pytest.raises(kvtrace.KvtraceError, match=r"bad.lct: byte \d+"):
        kvtrace.read(bad)
    with pytest.raises(kvtrace.KvtraceError, match="l1-size-gb"):
        kvtrace.replay(CHURN, l1_size_gb="x")


def test_a_large_trace_streams_in_bounded_memory(tmp_path):
    big = tmp_path / "big.lct"
    cli("generate", big, "--records", 400000)
    size = big.stat().st_size
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    rows = 0
    keys = 0
    for batch in kvtrace.read(big, batches=True):
        rows += batch.num_rows
        keys += pc.sum(batch.column("num_keys")).as_py() or 0
    grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - before
    assert grown < size / 4, f"peak grew {grown >> 20} MiB reading {size >> 20} MiB"
    assert rows == 400000
    key_rows = sum(b.num_rows for b in kvtrace.keys(big, ["frame"], batches=True))
    assert key_rows == keys > rows
