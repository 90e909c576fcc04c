//! Helpers shared by the integration tests.
#![allow(dead_code)]

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

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

/// Runs the `kvtrace` binary built for these tests.
pub fn kvtrace<S: AsRef<OsStr>>(args: impl IntoIterator<Item = S>) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kvtrace"))
        .args(args)
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
