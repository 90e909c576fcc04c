//! `convert` to Parquet and Arrow, and `--parquet` tables, read back with the parquet and
//! Arrow readers and checked against what `dump` and the CSV exporter print (computed here
//! from their text, not from the columnar code).

use std::fs::File;
use std::path::Path;

use arrow_array::cast::AsArray;
use arrow_array::types::{Float64Type, UInt32Type, UInt64Type};
use arrow_array::{Array, RecordBatch};
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use serde_json::Value as Json;

use crate::util::{kvtrace, one_line_error, repo, sample, scratch, shared, text};

fn read_parquet(path: &Path) -> Vec<RecordBatch> {
    let file = File::open(path).expect("open parquet");
    let builder = ParquetRecordBatchReaderBuilder::try_new(file).expect("parquet footer");
    if let Some(view) = builder.schema().metadata().get("kvtrace.view") {
        let header = &builder.schema().metadata()["kvtrace.header"];
        let header: Json = serde_json::from_str(header).expect("header metadata");
        assert_eq!(header["type"], "header", "{view}");
    }
    builder
        .build()
        .expect("reader")
        .map(|b| b.expect("batch"))
        .collect()
}

fn read_arrow(path: &Path) -> Vec<RecordBatch> {
    let file = File::open(path).expect("open arrow");
    arrow_ipc::reader::FileReader::try_new(file, None)
        .expect("arrow footer")
        .map(|b| b.expect("batch"))
        .collect()
}

/// `dump`'s records (the header and undecodable frames left out).
fn dumped(trace: &Path) -> Vec<Json> {
    let out = kvtrace(["dump".as_ref(), "--no-header".as_ref(), trace.as_os_str()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    text(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).expect("dump line"))
        .collect()
}

/// The chunk hashes a call names, read from dump's JSON: `keys`, or every key group of a
/// prefetch spec, or an events batch's entries.
fn keys_of(args: &Json) -> Vec<String> {
    let hashes = |keys: &Json| -> Vec<String> {
        keys.as_array()
            .map(|ks| {
                ks.iter()
                    .map(|k| k["chunk_hash"].as_str().expect("hash").to_owned())
                    .collect()
            })
            .unwrap_or_default()
    };
    if args.get("keys").is_some() {
        return hashes(&args["keys"]);
    }
    if let Some(groups) = args["spec"]["key_groups"].as_array() {
        return groups.iter().flat_map(|g| hashes(&g["keys"])).collect();
    }
    args["entries"]
        .as_array()
        .map(|es| {
            es.iter()
                .map(|e| e["key"]["chunk_hash_hex"].as_str().expect("hex").to_owned())
                .collect()
        })
        .unwrap_or_default()
}

fn column<'a>(batch: &'a RecordBatch, name: &str) -> &'a dyn Array {
    batch
        .column_by_name(name)
        .unwrap_or_else(|| panic!("column {name}"))
        .as_ref()
}

fn float(v: &Json) -> f64 {
    v.as_f64().unwrap_or(f64::NAN)
}

/// Every record of `trace` as Parquet (all columns) and as Arrow IPC equals dump's record:
/// place, times, qualname, arguments, request id, keys.
fn records_equal_dump(trace: &Path) {
    let dir = scratch();
    let all = "frame,offset,len,t_mono,t_wall,qualname,call,request_id,num_keys,keys,event_type,tier,undecodable,args";
    let parquet = dir.path().join("t.parquet");
    let arrow = dir.path().join("t.arrow");
    for out in [&parquet, &arrow] {
        let o = kvtrace([
            "convert".as_ref(),
            trace.as_os_str(),
            out.as_os_str(),
            "--columns".as_ref(),
            all.as_ref(),
        ]);
        assert!(o.status.success(), "{}", text(&o.stderr));
    }
    let expected = dumped(trace);
    let batches = read_parquet(&parquet);
    let columns = |batches: &[RecordBatch]| -> Vec<_> {
        batches.iter().map(|b| b.columns().to_vec()).collect()
    };
    assert_eq!(
        columns(&read_arrow(&arrow)),
        columns(&batches),
        "Arrow IPC and Parquet hold the same rows"
    );
    let mut rows = 0;
    for batch in &batches {
        for i in 0..batch.num_rows() {
            let want = &expected[rows];
            rows += 1;
            let at = format!("{} row {rows}", trace.display());
            let u64s = |name| column(batch, name).as_primitive::<UInt64Type>().value(i);
            assert_eq!(
                u64s("frame"),
                want["frame"].as_u64().expect("fixture"),
                "{at}"
            );
            assert_eq!(
                u64s("offset"),
                want["offset"].as_u64().expect("fixture"),
                "{at}"
            );
            let len = column(batch, "len").as_primitive::<UInt32Type>().value(i);
            assert_eq!(
                u64::from(len),
                want["len"].as_u64().expect("fixture"),
                "{at}"
            );
            if want.get("undecodable").is_some() {
                assert_eq!(
                    column(batch, "undecodable").as_string::<i32>().value(i),
                    want["undecodable"].as_str().expect("fixture")
                );
                assert!(column(batch, "qualname").is_null(i), "{at}");
                continue;
            }
            for t in ["t_mono", "t_wall"] {
                let got = column(batch, t).as_primitive::<Float64Type>().value(i);
                assert_eq!(got.to_bits(), float(&want[t]).to_bits(), "{at} {t}");
            }
            let qualname = column(batch, "qualname").as_string::<i32>().value(i);
            assert_eq!(
                qualname,
                want["qualname"].as_str().expect("fixture"),
                "{at}"
            );
            let args: Json =
                serde_json::from_str(column(batch, "args").as_string::<i32>().value(i))
                    .expect("args JSON");
            assert_eq!(args, want["args"], "{at}");
            let request = column(batch, "request_id").as_string::<i32>();
            match want["args"]["external_request_id"].as_str() {
                Some(id) => assert_eq!(request.value(i), id, "{at}"),
                None => assert!(request.is_null(i), "{at}"),
            }
            let keys = column(batch, "keys").as_list::<i32>().value(i);
            let got: Vec<String> = keys
                .as_binary::<i32>()
                .iter()
                .map(|h| hex::encode(h.expect("hash")))
                .collect();
            assert_eq!(got, keys_of(&want["args"]), "{at}");
            let n = column(batch, "num_keys")
                .as_primitive::<UInt32Type>()
                .value(i);
            assert_eq!(n as usize, got.len(), "{at}");
        }
    }
    assert_eq!(rows, expected.len(), "{}: every record", trace.display());
}

#[test]
fn parquet_and_arrow_records_equal_dump_on_lmcache_samples() {
    for name in crate::util::SAMPLES {
        records_equal_dump(&sample(name));
    }
    records_equal_dump(Path::new(&repo("testdata/lmcache/churn/lru_seed1.lct")));
}

#[test]
fn parquet_records_equal_dump_on_shared_recordings() {
    let Some(shared) = shared() else {
        return;
    };
    for name in ["churn_lru", "churn_l2fs", "events_churn"] {
        records_equal_dump(&shared.join(format!("lmcache/{name}.lct")));
    }
}

/// The keys view has one row per key, in call order, with the key's fields.
#[test]
fn the_keys_view_has_one_row_per_key_a_call_names() {
    let trace = Path::new(&repo("testdata/lmcache/churn/arc_seed2.lct")).to_owned();
    let dir = scratch();
    let out = dir.path().join("k.parquet");
    let o = kvtrace([
        "convert".as_ref(),
        trace.as_os_str(),
        out.as_os_str(),
        "--view".as_ref(),
        "keys".as_ref(),
    ]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let mut want: Vec<(u64, usize, String, String)> = Vec::new();
    for r in dumped(&trace) {
        for (position, hash) in keys_of(&r["args"]).into_iter().enumerate() {
            let call = r["qualname"]
                .as_str()
                .expect("fixture")
                .rsplit("StorageManager.")
                .next();
            want.push((
                r["frame"].as_u64().expect("fixture"),
                position,
                hash,
                call.expect("fixture").into(),
            ));
        }
    }
    let mut got = Vec::new();
    for batch in read_parquet(&out) {
        for i in 0..batch.num_rows() {
            let call = column(&batch, "call").as_string::<i32>().value(i);
            got.push((
                column(&batch, "frame")
                    .as_primitive::<UInt64Type>()
                    .value(i),
                column(&batch, "position")
                    .as_primitive::<UInt32Type>()
                    .value(i) as usize,
                hex::encode(column(&batch, "chunk_hash").as_binary::<i32>().value(i)),
                call.replace(".enter", ".__enter__")
                    .replace(".exit", ".__exit__"),
            ));
            assert_eq!(
                column(&batch, "model_name").as_string::<i32>().value(i),
                "demo/tiny-llama"
            );
        }
    }
    assert!(!want.is_empty());
    assert_eq!(got, want);
}

/// A truncated trace converts up to its tail, with a warning; a bad frame length stops the
/// conversion with its byte offset and leaves no output.
#[test]
fn damaged_traces_convert_what_is_whole_or_nothing() {
    let dir = scratch();
    let out = dir.path().join("t.parquet");
    let truncated = sample("basic_lru.truncated");
    let o = kvtrace(["convert".as_ref(), truncated.as_os_str(), out.as_os_str()]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert!(
        text(&o.stderr).contains("truncated tail"),
        "{}",
        text(&o.stderr)
    );
    let rows: usize = read_parquet(&out).iter().map(RecordBatch::num_rows).sum();
    assert_eq!(rows, dumped(&truncated).len());

    let mut bytes = std::fs::read(sample("basic_lru")).expect("fixture");
    let bad = dir.path().join("bad.lct");
    // The third record's length prefix claims 4 GiB.
    let third = dumped(&sample("basic_lru"))[2]["offset"]
        .as_u64()
        .expect("fixture") as usize;
    bytes[third..third + 4].copy_from_slice(&[0xff; 4]);
    std::fs::write(&bad, &bytes).expect("fixture");
    let failed = dir.path().join("bad.parquet");
    let o = kvtrace(["convert".as_ref(), bad.as_os_str(), failed.as_os_str()]);
    let err = one_line_error(&o, 1);
    assert!(err.contains("bad.lct: byte "), "{err}");
    assert!(!failed.exists(), "no half-written output");
    assert_eq!(
        std::fs::read_dir(dir.path()).expect("fixture").count(),
        2,
        "no temporary left"
    );
}

#[test]
fn columnar_flags_are_checked_in_one_line() {
    let dir = scratch();
    let trace = sample("basic_lru");
    let t = trace.to_str().expect("fixture");
    let out = dir.path().join("o.parquet");
    let o = out.to_str().expect("fixture");
    let lct = dir.path().join("o.lct");
    for (args, needle) in [
        (
            vec!["convert", t, o, "--columns", "frame,nope"],
            "column \"nope\"",
        ),
        (
            vec!["convert", t, o, "--columns", "frame,frame"],
            "named twice",
        ),
        (
            vec![
                "convert",
                t,
                lct.to_str().expect("fixture"),
                "--view",
                "keys",
            ],
            "--view and --columns",
        ),
        (
            vec!["convert", t, "-", "--to", "parquet"],
            "not standard streams",
        ),
        (vec!["convert", t, o, "--schema", "1"], "--schema"),
    ] {
        let out = kvtrace(&args);
        let err = one_line_error(&out, 2);
        assert!(err.contains(needle), "{args:?}: {err}");
    }
    assert!(!out.exists());
    let o = kvtrace(["convert", t, t, "--to", "parquet"]);
    one_line_error(&o, 2);
}

/// `replay --parquet` writes one Parquet file per CSV table, with the CSV's rows and columns:
/// counts as integers, figures as floats.
#[test]
fn replay_parquet_tables_are_the_csv_tables_typed() {
    let dir = scratch();
    let trace = Path::new(&repo("testdata/lmcache/churn/lru_seed1.lct")).to_owned();
    let o = kvtrace([
        "replay".as_ref(),
        trace.as_os_str(),
        "--output-dir".as_ref(),
        dir.path().as_os_str(),
        "--parquet".as_ref(),
        "-q".as_ref(),
    ]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    for table in ["requests", "ops", "tiers", "tier_io", "divergences"] {
        let csv = dir.path().join(format!("trace_replay_{table}.csv"));
        let mut reader = csv::Reader::from_path(&csv).expect("csv");
        let header: Vec<String> = reader
            .headers()
            .expect("fixture")
            .iter()
            .map(String::from)
            .collect();
        let rows: Vec<csv::StringRecord> = reader.records().map(|r| r.expect("fixture")).collect();
        let batches = read_parquet(&dir.path().join(format!("trace_replay_{table}.parquet")));
        let total: usize = batches.iter().map(RecordBatch::num_rows).sum();
        assert_eq!(total, rows.len(), "{table}");
        let Some(batch) = batches.first() else {
            continue;
        };
        let names: Vec<String> = batch
            .schema()
            .fields()
            .iter()
            .map(|f| f.name().clone())
            .collect();
        assert_eq!(names, header, "{table}");
        for (c, name) in header.iter().enumerate() {
            let array = batch.column(c);
            for (i, row) in rows.iter().take(batch.num_rows()).enumerate() {
                let cell = &row[c];
                if cell.is_empty() {
                    assert!(array.is_null(i), "{table}.{name} row {i}");
                    continue;
                }
                let shown = match array.data_type() {
                    arrow_schema::DataType::UInt64 => {
                        array.as_primitive::<UInt64Type>().value(i).to_string()
                    }
                    arrow_schema::DataType::Float64 => {
                        let v = array.as_primitive::<Float64Type>().value(i);
                        let parsed: f64 = cell.parse().expect("number");
                        // A measure's CSV text is the value to six decimals, compared as
                        // that text (a tolerance of 5e-7 failed once in CI on a measured
                        // time); any other number is printed to round-trip.
                        assert!(
                            format!("{v:.6}") == cell || v == parsed,
                            "{table}.{name} row {i}: {v} against {cell}"
                        );
                        continue;
                    }
                    arrow_schema::DataType::Boolean => array.as_boolean().value(i).to_string(),
                    _ => array.as_string::<i32>().value(i).to_owned(),
                };
                assert_eq!(shown, cell, "{table}.{name} row {i}");
            }
        }
    }
    let requests = read_parquet(&dir.path().join("trace_replay_requests.parquet"));
    let schema = requests[0].schema();
    assert!(
        schema
            .fields()
            .iter()
            .any(|f| f.data_type() == &arrow_schema::DataType::UInt64),
        "counts stay integers"
    );
}
