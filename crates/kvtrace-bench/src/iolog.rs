//! `--io-trace-log`: one CSV row per tier operation, with kv-cache.py's columns
//! (`Timestamp,Operation,Object_Size_Bytes,Tier,Key,Phase`), so a run's I/O pattern can be
//! studied or fed to another tool without the devices. A name ending in `.zst` is
//! compressed. Rows are written as operations complete, from every worker thread.

use std::io::{self, Write};
use std::path::Path;
use std::sync::Mutex;
use std::time::Instant;

use kvtrace_cache::storage::KeyId;
use kvtrace_lmct::TraceSink;

/// What happened to an entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IoOp {
    Write,
    Read,
    /// Left a tier: moved down, or deleted from the last one.
    Evict,
}

impl IoOp {
    fn name(self) -> &'static str {
        match self {
            IoOp::Write => "Write",
            IoOp::Read => "Read",
            IoOp::Evict => "Evict",
        }
    }

    /// The phase column: writes happen in prefill, reads in decode, evictions in neither.
    fn phase(self) -> &'static str {
        match self {
            IoOp::Write => "Prefill",
            IoOp::Read => "Decode",
            IoOp::Evict => "Eviction",
        }
    }
}

struct Sink {
    out: Option<TraceSink>,
    error: Option<io::Error>,
}

pub struct IoLog {
    sink: Mutex<Sink>,
    began: Instant,
}

impl IoLog {
    pub fn create(path: &Path) -> kvtrace_io::Result<IoLog> {
        let zstd = path.to_string_lossy().ends_with(".zst");
        let shown = path.display().to_string();
        let mut out = TraceSink::create(path, zstd.then_some(3)).map_err(|e| e.in_file(&shown))?;
        out.write_all(b"Timestamp,Operation,Object_Size_Bytes,Tier,Key,Phase\n")
            .map_err(|e| kvtrace_io::Error::io("cannot write", e).in_file(&shown))?;
        Ok(IoLog {
            sink: Mutex::new(Sink {
                out: Some(out),
                error: None,
            }),
            began: Instant::now(),
        })
    }

    /// Logs one operation; the first write error is kept for [`IoLog::finish`].
    pub fn row(&self, op: IoOp, size: u64, tier: &str, key: KeyId) {
        let t = self.began.elapsed().as_secs_f64();
        let line = format!(
            "{t:.6},{},{size},{},{},{}\n",
            op.name(),
            tier,
            key.hex(),
            op.phase()
        );
        let mut s = self.sink.lock().unwrap_or_else(|p| p.into_inner());
        if s.error.is_some() {
            return;
        }
        if let Some(out) = s.out.as_mut() {
            if let Err(e) = out.write_all(line.as_bytes()) {
                s.error = Some(e);
            }
        }
    }

    /// Flushes and closes the log; reports the first write error.
    pub fn finish(&self) -> io::Result<()> {
        let mut s = self.sink.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(e) = s.error.take() {
            return Err(e);
        }
        match s.out.take() {
            Some(out) => out.finish(),
            None => Ok(()),
        }
    }
}
