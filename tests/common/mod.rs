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
