//! What the integration tests share: the binary and its one-line errors, the bundled samples,
//! `../shared`, and fixtures — scratch directories, keys, chunk layouts, traces written call by
//! call.

use std::ffi::OsStr;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use kvtrace::lmct::calls::StorageCall;
use kvtrace::lmct::codec::{MemoryLayoutDesc, ObjectKey};
use kvtrace::lmct::{Header, TraceWriter};
use kvtrace::storage::config::StorageConfig;

/// The LMCache 0.5.6 samples copied into the repository (see testdata/lmcache/PROVENANCE.md).
pub const SAMPLES: [&str; 4] = [
    "basic_lru",
    "basic_lru.truncated",
    "empty_arc",
    "unknown_qualname",
];

pub fn sample(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("testdata/lmcache/{name}.lct"))
}

pub fn sample_text(name: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("testdata/lmcache/{name}"));
    std::fs::read_to_string(path).expect("sample text")
}

/// A file of the repository, by its path from the root, as a string for a command line.
pub fn repo(relative: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join(relative)
        .display()
        .to_string()
}

/// `../shared` beside the repository, when present. Tests that need it skip with a message
/// in a fresh clone; CI always has it.
pub fn shared() -> Option<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared");
    if dir.join("lmcache").is_dir() {
        Some(dir)
    } else {
        eprintln!("SKIP: ../shared is absent (fresh clone); this check runs in CI");
        None
    }
}

/// A fresh scratch directory for a test's outputs, removed with everything in it when dropped.
pub fn scratch() -> tempfile::TempDir {
    tempfile::tempdir().expect("scratch directory")
}

/// Whether `program` runs; says SKIP when it does not.
pub fn installed(program: &str) -> bool {
    let found = Command::new(program)
        .arg("--version")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok();
    if !found {
        eprintln!("SKIP: {program} is not installed (.ci/run installs it)");
    }
    found
}

/// `mpirun -np np kvtrace args…` (as root where CI runs it); `None` without Open MPI.
pub fn mpirun(np: usize, args: &[&str]) -> Option<Output> {
    if !installed("mpirun") {
        return None;
    }
    Some(
        Command::new("mpirun")
            .args(["-np", &np.to_string(), "--oversubscribe"])
            .arg(env!("CARGO_BIN_EXE_kvtrace"))
            .args(args)
            // CI runs as root; Open MPI refuses root without these.
            .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
            .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
            .output()
            .expect("mpirun"),
    )
}

/// A loopback port nothing listens on: bound, then released (a server a test starts takes it,
/// or a client finds it refused).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

/// Two different free ports: each is released when chosen, so a second probe may be handed
/// the first one again before its server binds it.
pub fn free_ports() -> (u16, u16) {
    let first = free_port();
    loop {
        let second = free_port();
        if second != first {
            return (first, second);
        }
    }
}

/// A server process a test started, killed and reaped when the test drops it.
#[cfg(any(feature = "redis", feature = "s3"))]
pub struct KillOnDrop(pub std::process::Child);

#[cfg(any(feature = "redis", feature = "s3"))]
impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The key of the chunk whose hash is `chunk_hash`, in the shape LMCache writes (model `m`,
/// its usual packed rank, no group, no salt).
pub fn key(chunk_hash: impl Into<Vec<u8>>) -> ObjectKey {
    ObjectKey {
        chunk_hash: chunk_hash.into(),
        model_name: "m".into(),
        kv_rank: 16_777_472,
        object_group_id: 0,
        cache_salt: String::new(),
    }
}

/// A chunk of `tokens` tokens of a small bf16 model: 2 × 4 × `tokens` × 64.
pub fn layout(tokens: i64) -> MemoryLayoutDesc {
    MemoryLayoutDesc {
        shapes: vec![vec![2, 4, tokens, 64]],
        dtypes: vec!["torch.bfloat16".into()],
    }
}

/// A storage trace written call by call, as LMCache 0.5.6 writes one: its header carries
/// `config`, each call is a record at its trace time (wall time 1.7e9 s later).
pub struct TraceBuilder {
    writer: TraceWriter<File>,
    args: Vec<u8>,
}

impl TraceBuilder {
    pub fn create(path: &Path, config: &StorageConfig) -> TraceBuilder {
        let file = File::create(path).expect("create the trace");
        let mut writer = TraceWriter::new(file, Header::storage(100.0, 1.7e9));
        writer
            .attach_storage_config_value(&config.to_lmcache_json())
            .expect("attach the configuration");
        TraceBuilder {
            writer,
            args: Vec::new(),
        }
    }

    /// Appends `call` at trace time `t` seconds.
    pub fn call(&mut self, t: f64, call: StorageCall<'_>) -> &mut TraceBuilder {
        self.args.clear();
        call.encode_args(&mut self.args);
        self.writer
            .write_record_parts(t, 1.7e9 + t, call.qualname(), &self.args)
            .expect("write a record");
        self
    }

    pub fn finish(self) {
        self.writer.finish().expect("finish the trace");
    }
}

/// Runs the `kvtrace` binary built for these tests.
pub fn kvtrace<S: AsRef<OsStr>>(args: impl IntoIterator<Item = S>) -> Output {
    kvtrace_with(args, &[])
}

/// Runs the `kvtrace` binary with these environment variables set. `COLUMNS` is removed
/// unless given, so a developer's wide terminal changes no table a test compares.
pub fn kvtrace_with<S: AsRef<OsStr>>(
    args: impl IntoIterator<Item = S>,
    vars: &[(&str, &str)],
) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kvtrace"))
        .args(args)
        .env_remove("COLUMNS")
        .envs(vars.iter().copied())
        .output()
        .expect("run kvtrace")
}

pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The error of a refused run: exit `code` and one line on stderr, returned.
pub fn one_line_error(out: &Output, code: i32) -> String {
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(code), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    err
}

/// A small bench: two users of the smallest model, no CPU tier, no generation time.
pub const TINY_BENCH: [&str; 10] = [
    "bench",
    "-q",
    "--model",
    "tiny-1b",
    "--num-users",
    "2",
    "--cpu-mem-gb",
    "0",
    "--generation-mode",
    "none",
];

/// Replays `trace` as the only rank of a run into `out_dir`; the rank's JSON summary.
pub fn one_rank_replay(trace: &Path, out_dir: &Path) -> PathBuf {
    let out = kvtrace([
        "replay".as_ref(),
        trace.as_os_str(),
        "-q".as_ref(),
        "--json".as_ref(),
        "--no-csv".as_ref(),
        "--rank".as_ref(),
        "0".as_ref(),
        "--world-size".as_ref(),
        "1".as_ref(),
        "--output-dir".as_ref(),
        out_dir.as_os_str(),
    ] as [&OsStr; 11]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    out_dir.join("rank-00000/trace_replay_summary.json")
}

/// Stores three 128 KiB objects through `sm` (L1, written through to its first L2 tier),
/// empties L1, and prefetches them again: every chunk must come back from the L2 tier, its
/// bytes read. `after_store` sees the manager in between (a test checks the tier's server).
#[cfg(any(feature = "redis", feature = "s3"))]
pub fn l2_serves_what_l1_lost(
    sm: kvtrace::storage::StorageManager,
    after_store: impl FnOnce(&kvtrace::storage::StorageManager),
) {
    use kvtrace::bus::Tracer;
    use kvtrace::lmct::codec::{LockMode, PrefetchTaskSpec};
    use kvtrace::storage::Traced;
    let mut sm = Traced::new(sm, Tracer::disabled());
    let layout = MemoryLayoutDesc {
        shapes: vec![vec![2, 4, 64, 128]],
        dtypes: vec!["torch.bfloat16".into()],
    };
    let keys: Vec<ObjectKey> = (0..3u8).map(|i| key(vec![i; 32])).collect();
    sm.reserve_write(&keys, &layout);
    assert_eq!(sm.finish_write(&keys).expect("stored").len(), 3);
    after_store(sm.manager());
    sm.manager_mut().clear();
    let spec = PrefetchTaskSpec::single_group(keys.clone(), layout, "prefix", LockMode::Lock);
    let hit = sm
        .submit_prefetch_task(&spec, "r", false)
        .expect("prefetch");
    assert_eq!((hit.l1_hit_chunks, hit.l2_hit_chunks), (0, 3));
    assert!(sm.read_prefetched_enter(&keys).is_ok());
    assert_eq!(sm.manager().tier_stats()[1].bytes_read, 3 * 131_072);
}
