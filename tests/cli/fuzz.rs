//! Bounded mutation fuzzing of every parser that reads untrusted input: the LMCT reader,
//! JSONL → LCT conversion, the Mooncake loader (and a simulation of what it accepts), the
//! request-trace formats AISimulate reads (and a simulation of each under both engines), the
//! ShareGPT and BurstGPT loaders, the TOML tier hierarchy, the L2 adapter JSON, aggregate's
//! rank reports, sweep lists and grids, rank-mode environments, events-level traces, and the
//! OTLP file written from hostile span values.
//!
//! Each target mutates a seed corpus (the files in `testdata/` and small inline samples) for
//! `KVTRACE_FUZZ_SECONDS` seconds (default 2; `tools/fuzz.sh` runs minutes) from
//! `KVTRACE_FUZZ_SEED` (default: fixed, so CI is reproducible). Any input is allowed to be
//! refused; none may panic. A panicking input is saved under `target/fuzz-failures/` and
//! named in the failure.

use crate::util::scratch;

use std::io::Cursor;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use kvtrace::lmct::args::CallArgs;
use kvtrace::lmct::blocks::{fold_records, read_ahead};
use kvtrace::lmct::display::to_display;
use kvtrace::lmct::value::Value;
use kvtrace::lmct::{Frame, Header, ReadOptions, TraceReader};
use kvtrace::rng::SplitMix64;
use kvtrace::simulate::args::{EngineArgs, EngineVersion};
use kvtrace::simulate::event_loop::{simulate, SimConfig};
use kvtrace::simulate::mooncake::read_mooncake;
use kvtrace::simulate::router::RouterMode;
use kvtrace::simulate::workload::Workload;
use kvtrace::storage::config::{L2Config, StorageConfig};
use kvtrace::trace::convert::{convert, ConvertOptions, Kind};

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn budget() -> Duration {
    let secs = std::env::var("KVTRACE_FUZZ_SECONDS")
        .ok()
        .and_then(|s| s.parse::<f64>().ok())
        .unwrap_or(2.0);
    Duration::from_secs_f64(secs.max(0.0))
}

/// Values that break parsers more often than random bytes do.
const TOKENS: [&[u8]; 22] = [
    b"0",
    b"-1",
    b"1e309",
    b"NaN",
    b"18446744073709551616",
    b"4294967296",
    b"\"",
    b"[",
    b"]",
    b"{",
    b"}",
    b",",
    b":",
    b"\n",
    b"null",
    b"\xff",
    b"\xc0",
    b"\xdd\xff\xff\xff\xff",
    b"\xdf\xff\xff\xff\xff",
    b"\xcb\x7f\xf0\x00\x00\x00\x00\x00\x00",
    b"[[[[[[[[",
    b"{\"$enc\":\"array32\",\"v\":",
];

struct Mutator {
    rng: SplitMix64,
}

impl Mutator {
    fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            (self.rng.next_u64() % n as u64) as usize
        }
    }

    /// One to eight edits of `seed`: bit flips, interesting bytes and tokens, insertions,
    /// deletions, duplicated runs, truncation and splices from `other`.
    fn mutate(&mut self, seed: &[u8], other: &[u8]) -> Vec<u8> {
        let mut v = seed.to_vec();
        for _ in 0..1 + self.below(8) {
            let at = self.below(v.len() + 1);
            match self.below(8) {
                0 if !v.is_empty() => {
                    let i = self.below(v.len());
                    v[i] ^= 1 << self.below(8);
                }
                1 if !v.is_empty() => {
                    let i = self.below(v.len());
                    v[i] = [0x00, 0xff, 0x7f, 0x80, 0xc1, 0xdc, 0xde, 0xd9][self.below(8)];
                }
                2 => {
                    let t = TOKENS[self.below(TOKENS.len())];
                    v.splice(at..at, t.iter().copied());
                }
                3 => {
                    let end = (at + self.below(64)).min(v.len());
                    v.drain(at..end);
                }
                4 => {
                    let end = (at + self.below(256)).min(v.len());
                    let run: Vec<u8> = v[at..end].to_vec();
                    v.splice(at..at, run);
                }
                5 => v.truncate(at),
                6 if !other.is_empty() => {
                    let from = self.below(other.len());
                    let end = (from + self.below(512)).min(other.len());
                    v.splice(at..at, other[from..end].iter().copied());
                }
                _ => {
                    let n = self.below(16);
                    let bytes: Vec<u8> = (0..n).map(|_| self.rng.next_u64() as u8).collect();
                    v.splice(at..at, bytes);
                }
            }
        }
        v
    }
}

/// Runs `target` on mutations of `seeds` until the time budget is spent.
fn fuzz(name: &str, seeds: &[Vec<u8>], mut target: impl FnMut(&[u8])) {
    let seed = std::env::var("KVTRACE_FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x6b76_7472);
    let mut m = Mutator {
        rng: SplitMix64::new(seed ^ name.len() as u64),
    };
    let deadline = Instant::now() + budget();
    let mut runs = 0u64;
    for s in seeds {
        run_one(name, s, &mut target, runs);
    }
    while Instant::now() < deadline {
        let a = m.below(seeds.len());
        let b = m.below(seeds.len());
        let input = m.mutate(&seeds[a], &seeds[b]);
        run_one(name, &input, &mut target, runs);
        runs += 1;
    }
    eprintln!("fuzz {name}: {runs} mutated inputs, no panic");
}

fn run_one(name: &str, input: &[u8], target: &mut impl FnMut(&[u8]), n: u64) {
    if catch_unwind(AssertUnwindSafe(|| target(input))).is_err() {
        let dir = root().join("target/fuzz-failures");
        let _ = std::fs::create_dir_all(&dir);
        let path = dir.join(format!("{name}-{n}.bin"));
        let _ = std::fs::write(&path, input);
        panic!("fuzz {name}: input {} panicked", path.display());
    }
}

fn read(path: PathBuf) -> Vec<u8> {
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn lct_seeds() -> Vec<Vec<u8>> {
    [
        "basic_lru",
        "basic_lru.truncated",
        "empty_arc",
        "unknown_qualname",
    ]
    .iter()
    .map(|n| read(root().join(format!("testdata/lmcache/{n}.lct"))))
    .collect()
}

#[test]
fn lmct_reader() {
    fuzz("lmct_reader", &lct_seeds(), |bytes| {
        let options = ReadOptions {
            max_frame_bytes: 1 << 20,
            ..ReadOptions::default()
        };
        let Ok(mut reader) = TraceReader::from_reader(Cursor::new(bytes.to_vec()), options) else {
            return;
        };
        for _ in 0..10_000 {
            match reader.next_frame() {
                Ok(Some(Frame::Record(r))) => {
                    let _ = to_display(r.args);
                    let _ = r.args.to_value();
                }
                Ok(Some(_)) => {}
                Ok(None) | Err(_) => break,
            }
        }
        // The block reader, on two threads, over the same bytes: no panic, no hang, and the
        // records the frame reader sees when it reaches the end without an error.
        let Ok(again) = TraceReader::from_reader(Cursor::new(bytes.to_vec()), options) else {
            return;
        };
        let mut seen = 0u64;
        let blocks = fold_records(
            again,
            2,
            4096,
            &|| 0u64,
            &|n: &mut u64, _| *n += 1,
            &mut |n| seen += n,
            &|_, _| {},
        );
        if let Ok(summary) = blocks {
            assert_eq!(summary.records, seen);
        }
        // Replay's path: read ahead on two workers, each record's arguments read in one pass.
        let Ok(again) = TraceReader::from_reader(Cursor::new(bytes.to_vec()), options) else {
            return;
        };
        let mut handed = 0u64;
        let ahead = read_ahead(
            again,
            4096,
            2,
            &|| (),
            &|_, r| CallArgs::read(r.args).is_some_and(|a| a.keys.is_present()),
            &mut |_, _| {
                handed += 1;
                Ok(true)
            },
        );
        if let Ok(summary) = ahead {
            assert_eq!(summary.records, handed);
        }
    });
}

#[test]
fn jsonl_to_lct() {
    let dir = scratch();
    let seeds: Vec<Vec<u8>> = ["basic_lru", "unknown_qualname"]
        .iter()
        .map(|n| {
            let out = dir.path().join(format!("{n}.jsonl"));
            convert(
                &root().join(format!("testdata/lmcache/{n}.lct")),
                &out,
                ConvertOptions {
                    to: Kind::Jsonl,
                    to_schema_1: false,
                    zstd_level: 3,
                    read: ReadOptions::default(),
                },
                kvtrace::trace::QUIET,
            )
            .expect("seed");
            read(out)
        })
        .collect();
    let (input, output) = (dir.path().join("in.jsonl"), dir.path().join("out.lct"));
    fuzz("jsonl_to_lct", &seeds, |bytes| {
        std::fs::write(&input, bytes).expect("write");
        let options = ConvertOptions {
            to: Kind::Lct,
            to_schema_1: true,
            zstd_level: 3,
            read: ReadOptions {
                max_frame_bytes: 1 << 20,
                ..ReadOptions::default()
            },
        };
        let _ = convert(&input, &output, options, kvtrace::trace::QUIET);
    });
}

#[test]
fn mooncake_loader_and_simulation() {
    let slice = read(root().join("testdata/mooncake/conversation_head300.jsonl"));
    let head: Vec<u8> = slice
        .split(|b| *b == b'\n')
        .take(20)
        .flat_map(|l| l.iter().copied().chain([b'\n']))
        .collect();
    let sessions =
        br#"{"session_id":"a","timestamp":0,"input_length":700,"output_length":3,"hash_ids":[1,2]}
{"session_id":"a","delay":5,"input_length":1200,"output_length":2,"hash_ids":[1,2,3]}
{"timestamp":3,"input_tokens":10,"output_tokens":0,"hash_ids":[9],"priority":1}
"#
        .to_vec();
    let fleet = [small_fleet(EngineVersion::Dynamo142)];
    fuzz("mooncake", &[head, sessions], |bytes| {
        if let Ok(workload) = read_mooncake(Cursor::new(bytes), 512) {
            simulate_small(&workload, &fleet);
        }
    });
}

/// Two workers of 256 blocks under `version`'s engine: a fleet for what a fuzzed reader
/// accepted.
fn small_fleet(version: EngineVersion) -> SimConfig {
    SimConfig {
        engine: EngineArgs {
            num_gpu_blocks: 256,
            engine_version: version,
            ..EngineArgs::default()
        },
        workers: 2,
        prefill: None,
        router: RouterMode::RoundRobin,
        concurrency: None,
        seed: 1,
        online: false,
        observer: None,
    }
}

/// Simulates `workload` on each of `fleets` when it is small enough to take a moment.
fn simulate_small(workload: &Workload, fleets: &[SimConfig]) {
    let tokens: u64 = workload
        .sessions
        .iter()
        .flat_map(|s| &s.turns)
        .map(|t| u64::from(t.output_length) + u64::from(t.prompt.len))
        .sum();
    if workload.request_count() <= 64 && tokens <= 200_000 {
        for fleet in fleets {
            let _ = simulate(workload, fleet, None, &mut |_, _| {});
        }
    }
}

/// AISimulate's request-trace formats (mooncake-delta, agentic_mooncake legacy and v2, weka,
/// dynamo), each mutated from its sample in `testdata/traces/`, and a simulation of what
/// each accepts under both engines: a request graph of hostile dependencies, delays and
/// timestamps must end in a report or an error, never a panic.
#[test]
fn request_trace_formats_and_simulation() {
    use kvtrace::simulate::agentic::read_agentic_mooncake;
    use kvtrace::simulate::dynamo_trace::read_dynamo_request_trace;
    use kvtrace::simulate::mooncake::read_mooncake_delta;
    use kvtrace::simulate::weka::{read_weka, NestedTimestamps};

    let sample = |name: &str| read(root().join("testdata/traces").join(name));
    let dir = scratch();
    let weka = dir.path().join("corpus.jsonl");
    let engines = [EngineVersion::Dynamo142, EngineVersion::Aisimulate013];
    let fleets = engines.map(small_fleet);
    let run = |workload: &Workload| simulate_small(workload, &fleets);
    // Each target reads its samples unmutated, so that a reader refusing everything
    // cannot pass for one that survives everything.
    let delta = |bytes: &[u8]| read_mooncake_delta(Cursor::new(bytes), 64);
    let agentic =
        |bytes: &[u8], engine| read_agentic_mooncake(Cursor::new(bytes), None, engine, "fuzz", 1.0);
    let weka = |bytes: &[u8]| {
        std::fs::write(&weka, bytes).expect("write");
        read_weka(&weka, None, NestedTimestamps::Auto, 1.0)
    };
    let dynamo = |bytes: &[u8]| {
        read_dynamo_request_trace(vec![("part0".to_owned(), Cursor::new(bytes))], None)
    };
    let samples = [
        sample("mooncake_delta.jsonl"),
        sample("agentic_legacy.jsonl"),
        sample("agentic_v2.jsonl"),
        sample("weka_sample.jsonl"),
        sample("dynamo_trace.part0.jsonl"),
    ];
    delta(&samples[0]).expect("the mooncake-delta sample");
    for sample in &samples[1..3] {
        for engine in engines {
            agentic(sample, engine).expect("an agentic sample, under each engine");
        }
    }
    weka(&samples[3]).expect("the weka sample");
    dynamo(&samples[4]).expect("the dynamo sample");
    fuzz("mooncake-delta", &samples[..1], |bytes| {
        if let Ok(w) = delta(bytes) {
            run(&w);
        }
    });
    fuzz("agentic", &samples[1..3], |bytes| {
        for engine in engines {
            if let Ok(w) = agentic(bytes, engine) {
                run(&w);
            }
        }
    });
    fuzz("weka", &samples[3..4], |bytes| {
        if let Ok(w) = weka(bytes) {
            run(&w);
        }
    });
    fuzz("dynamo", &samples[4..], |bytes| {
        if let Ok(w) = dynamo(bytes) {
            run(&w);
        }
    });
}

#[test]
fn sharegpt_and_burstgpt_loaders() {
    let dir = scratch();
    let file = dir.path().join("input");
    let sharegpt = br#"[{"id":"x","conversations":[{"from":"human","value":"How are KV caches stored?"},{"from":"gpt","value":"In blocks of tokens, per layer."},{"from":"human","value":"And offloaded?"},{"from":"gpt","value":"To host memory, then disk."}]}]"#.to_vec();
    fuzz("sharegpt", &[sharegpt], |bytes| {
        std::fs::write(&file, bytes).expect("write");
        let _ = kvtrace::bench::sharegpt::load(&file, 100);
    });
    let burst = b"Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n5,ChatGPT,472,18,490,Conversation log\n45,GPT-4,1087,230,1317,API log\n".to_vec();
    fuzz("burstgpt", &[burst], |bytes| {
        std::fs::write(&file, bytes).expect("write");
        let _ = kvtrace::bench::burst::load(&file);
    });
}

#[test]
fn tier_config_and_adapter_json() {
    let toml = br#"[l1]
size_gb = 4
eviction_policy = "ARC"
trigger_watermark = 0.8

[[l2]]
type = "memory"
capacity_gb = 8

[[l2]]
type = "null"
"#
    .to_vec();
    fuzz("toml", &[toml], |bytes| {
        let Ok(text) = std::str::from_utf8(bytes) else {
            return;
        };
        let _ = StorageConfig::default().apply_toml(text);
    });
    let adapters = [
        br#"{"type":"memory","capacity_gb":2,"eviction_policy":"LRU"}"#.to_vec(),
        br#"{"type":"gpu","bandwidth_gbps":25}"#.to_vec(),
        br#"{"type":"resp","host":"localhost","port":6379}"#.to_vec(),
    ];
    fuzz("adapter", &adapters, |bytes| {
        if let Ok(v) = serde_json::from_slice::<serde_json::Value>(bytes) {
            let _ = L2Config::from_adapter(&v);
        }
    });
}

/// The one file `dir` holds.
fn only_file(dir: &Path) -> Vec<u8> {
    let mut files: Vec<PathBuf> = walk(dir);
    assert_eq!(files.len(), 1, "{files:?}");
    read(files.remove(0))
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).expect("read_dir").flatten() {
        let p = entry.path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}

#[test]
fn aggregate_rank_reports() {
    let dir = scratch();
    let trace = root().join("testdata/lmcache/basic_lru.lct");
    let replay = read(crate::util::one_rank_replay(
        &trace,
        &dir.path().join("replay"),
    ));
    let bench = dir.path().join("bench");
    std::fs::create_dir(&bench).expect("mkdir");
    let output = bench.join("r.json");
    let mut args = crate::util::TINY_BENCH.to_vec();
    args.extend([
        "--seed",
        "1",
        "--duration",
        "1",
        "--rank",
        "0",
        "--world-size",
        "1",
    ]);
    args.extend(["--output", output.to_str().expect("path")]);
    let out = crate::util::kvtrace(args);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        crate::util::text(&out.stderr)
    );
    let seeds = [replay, only_file(&bench)];
    let (a, b) = (dir.path().join("a.json"), dir.path().join("b.json"));
    let mut m = Mutator {
        rng: SplitMix64::new(7),
    };
    fuzz("aggregate", &seeds, |bytes| {
        std::fs::write(&a, bytes).expect("write");
        // Beside it, an unmutated rank of either kind, or the mutated one again.
        let other = &seeds[m.below(2)];
        std::fs::write(&b, other).expect("write");
        for files in [vec![a.as_path()], vec![a.as_path(), b.as_path()]] {
            if let Ok(run) = kvtrace::aggregate::aggregate(&files) {
                use kvtrace::report::Report;
                let _ = run.document();
                let _ = run.tables();
                let _ = run.terminal();
            }
        }
    });
}

#[test]
fn sweep_lists_and_grids() {
    let lists = [
        b"0.5,1,2".to_vec(),
        br#"{"type":"fs","path":"d"},{"type":"null"}"#.to_vec(),
        b"LRU,ARC".to_vec(),
    ];
    fuzz("sweep_list", &lists, |bytes| {
        let text = String::from_utf8_lossy(bytes);
        let Ok(axis) = kvtrace::sweep::Axis::parse("l1-size-gb", &text) else {
            return;
        };
        let axes = [axis.clone(), axis];
        let count = kvtrace::sweep::cross_count(&axes);
        if kvtrace::sweep::check_count(count, 1_000).is_ok() {
            let points = kvtrace::sweep::cross(&axes);
            assert_eq!(Some(points.len() as u64), count);
        }
    });
    let dir = scratch();
    let file = dir.path().join("grid.toml");
    let grid = br#"[[point]]
name = "small"
l1-size-gb = 2
eviction-policy = "ARC"

[[point]]
name = "fs"
l2-adapter = '{"type":"fs","path":"d"}'
l1-accounting-only = true
"#
    .to_vec();
    fuzz("sweep_grid", &[grid], |bytes| {
        std::fs::write(&file, bytes).expect("write");
        if let Ok(points) = kvtrace::sweep::grid(&file, 100) {
            assert!(points.len() <= 100);
        }
    });
}

#[test]
fn rank_environments() {
    let envs = [
        b"OMPI_COMM_WORLD_RANK=1\nOMPI_COMM_WORLD_SIZE=4\nOMPI_MCA_orte_hnp_uri=1234.0;tcp://10.0.0.1:5000".to_vec(),
        b"SLURM_PROCID=0\nSLURM_NTASKS=2\nSLURM_JOB_ID=77\nSLURM_STEP_ID=0".to_vec(),
        b"JOB_COMPLETION_INDEX=3\nPMI_RANK=2\nPMI_SIZE=4294967295".to_vec(),
    ];
    fuzz("rank_env", &envs, |bytes| {
        let text = String::from_utf8_lossy(bytes);
        let vars: Vec<(String, String)> = text
            .lines()
            .filter_map(|l| l.split_once('='))
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect();
        let env = |name: &str| vars.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone());
        let world = vars.first().and_then(|(_, v)| v.parse().ok());
        for world_size in [None, world] {
            let flags = kvtrace::rank::Given {
                rank: None,
                world_size,
                rank_name: "--rank",
                world_size_name: "--world-size",
            };
            if let Ok(Some(rank)) = kvtrace::rank::Rank::detect(&flags, env) {
                assert!(rank.rank < rank.world_size.max(1) || rank.world_size == 0);
                let _ = rank.dir_name();
                let _ = rank.seed(1);
                let _ = rank.file_name(Path::new("out/report.json"));
            }
        }
        if let Some(id) = kvtrace::rank::launcher_run_id(env) {
            // A directory name the barrier accepts, never a path.
            let name = id.len() <= 128
                && !id.starts_with('.')
                && id
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
            assert!(name, "{id:?}");
        }
    });
}

/// An events-level trace: kvtrace's events header, then the first records of LMCache's
/// events recording in ../shared when it is there, else of a storage sample (which an events
/// reader must refuse or skip cleanly).
fn events_seeds() -> Vec<Vec<u8>> {
    let meta = Value::Map(
        vec![
            (Value::str("instance_id"), Value::str("server-0")),
            (Value::str("cache_event_schema_version"), Value::int(1)),
            (Value::str("lmcache_version"), Value::str("0.5.6")),
        ],
        None,
    );
    let header = Header {
        level: "events".into(),
        level_meta: Some(meta),
        ..Header::storage(10.0, 1_795_297_114.0)
    };
    let mut body = Vec::new();
    header.encode(&mut body);
    let mut file = (body.len() as u32).to_be_bytes().to_vec();
    file.extend(body);
    let source =
        shared_events().unwrap_or_else(|| read(root().join("testdata/lmcache/basic_lru.lct")));
    // Skip the source's header frame; keep up to 64 records.
    let mut at = 0usize;
    let mut frames = 0;
    while at + 4 <= source.len() && frames <= 64 {
        let len = u32::from_be_bytes(source[at..at + 4].try_into().expect("4")) as usize;
        let end = (at + 4 + len).min(source.len());
        if frames > 0 {
            file.extend_from_slice(&source[at..end]);
        }
        at = end;
        frames += 1;
    }
    vec![file]
}

fn shared_events() -> Option<Vec<u8>> {
    let path = root().join("../shared/lmcache/events_churn.lct");
    path.is_file().then(|| read(path))
}

#[test]
fn events_traces() {
    let dir = scratch();
    let file = dir.path().join("events.lct");
    let options = ReadOptions {
        max_frame_bytes: 1 << 20,
        ..ReadOptions::default()
    };
    fuzz("events", &events_seeds(), |bytes| {
        std::fs::write(&file, bytes).expect("write");
        let _ = kvtrace::trace::inspect::inspect(&file, options, kvtrace::trace::QUIET)
            .map(|info| info.render());
        if let Ok(stream) = kvtrace::replay::events::fleet::FleetStream::load(&[&file], options) {
            let _ = kvtrace::replay::events::fleet::summarise(&stream);
        }
    });
}

#[cfg(feature = "otel")]
#[test]
fn otlp_file_from_hostile_span_values() {
    use kvtrace::otel::{Attr, ExportOptions, Protocol, RequestSpan, Span, SpanExport, SpanSink};
    let dir = scratch();
    let file = dir.path().join("spans.jsonl");
    let seeds = [
        b"req-1\x00\x00\x00\x00\x00\x00\xf0\x3f\x00\x00\x00\x00\x00\x00\x00\x40".to_vec(),
        b"\x1b[31mkvtrace: error\n\xff\xfe\x00\x00\x00\x00\x00\x00\xf0\x7f\xff\xff\xff\xff\xff\xff\xef\xff".to_vec(),
    ];
    fuzz("otlp_file", &seeds, |bytes| {
        let f64_at = |i: usize| {
            let mut b = [0u8; 8];
            for (k, v) in b.iter_mut().enumerate() {
                *v = bytes.get(i * 8 + k).copied().unwrap_or(0);
            }
            f64::from_le_bytes(b)
        };
        let text = String::from_utf8_lossy(bytes).into_owned();
        let mut request = RequestSpan {
            root: Span::new("request", f64_at(0), f64_at(1))
                .with("request_id", Attr::Str(text.clone()))
                .with("hit_rate", Attr::Float(f64_at(2)))
                .with("hit_tokens", Attr::Int(f64_at(3).to_bits() as i64)),
            children: Vec::new(),
        };
        request.push(Span::new("mp.retrieve", f64_at(4), f64_at(5)));
        let export = SpanExport::start(ExportOptions {
            endpoint: None,
            protocol: Protocol::HttpProtobuf,
            file: Some(file.clone()),
            resource: vec![("kvtrace.trace".into(), text)],
            timeout: Duration::from_secs(1),
        })
        .expect("start");
        export.request(request);
        let summary = export.finish();
        assert_eq!(summary.error, None);
        assert_eq!(summary.written, 2);
        let written = std::fs::read_to_string(&file).expect("the file is written");
        for line in written.lines() {
            serde_json::from_str::<serde_json::Value>(line).expect("every line is JSON");
        }
    });
}
