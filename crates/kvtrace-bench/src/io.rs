//! The benchmark's data path: whole KV entries written to and read from real files in
//! fixed-size chunks through one reusable buffer per worker thread, so memory does not grow
//! with entry sizes or user counts. Written data is noise stamped per 4 KiB block with the
//! entry and block number, so no two 4 KiB blocks are alike and inline deduplication on the
//! device finds nothing to save.

use std::fs;
use std::io::{self, Read, Write};
use std::os::unix::io::AsRawFd;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use kvtrace_cache::storage::file::{io_len, open_object, with_path, AlignedBuf};
use kvtrace_io::rng::SplitMix64;

/// Bytes moved per system call, and the size of each I/O worker's buffer: 256 KiB keeps the
/// device busy with large requests while 500 workers (the most a run starts) hold 130 MiB of
/// buffers, not the 2 GiB that 4 MiB chunks cost at 1,000 users.
pub const CHUNK: usize = 256 << 10;
const BLOCK: usize = 4096;

/// Seconds an operation spent in the host (open, buffered copies) and on the device
/// (durability flush for writes; the data transfer for reads).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct IoTime {
    pub host_s: f64,
    pub device_s: f64,
}

impl IoTime {
    pub fn total_s(&self) -> f64 {
        self.host_s + self.device_s
    }
}

/// One chunk of noise every thread writes from: an entry's bytes depend on its stamp only,
/// so a demotion rewrites exactly what was first written.
fn noise() -> &'static [u8] {
    static NOISE: OnceLock<Vec<u8>> = OnceLock::new();
    NOISE.get_or_init(|| {
        let mut rng = SplitMix64::new(0x6b76_7472_6163_6542);
        (0..CHUNK / 8)
            .flat_map(|_| rng.next_u64().to_le_bytes())
            .collect()
    })
}

/// A worker thread's I/O buffer, 4 KiB aligned (for `O_DIRECT`). With a cancel flag, an
/// entry's I/O stops between chunks once the flag is set (the run's deadline), failing with
/// `Interrupted`.
pub struct IoBuffer {
    buf: AlignedBuf,
    cancel: Option<Arc<AtomicBool>>,
}

impl Default for IoBuffer {
    fn default() -> Self {
        IoBuffer::new()
    }
}

impl IoBuffer {
    pub fn new() -> IoBuffer {
        IoBuffer {
            buf: AlignedBuf::with_len(CHUNK),
            cancel: None,
        }
    }

    /// A buffer whose I/O stops once `cancel` is set.
    pub fn with_cancel(cancel: Arc<AtomicBool>) -> IoBuffer {
        IoBuffer {
            cancel: Some(cancel),
            ..IoBuffer::new()
        }
    }

    /// `Interrupted` once the run stopped.
    pub fn check(&self) -> io::Result<()> {
        match &self.cancel {
            Some(c) if c.load(Ordering::Relaxed) => Err(io::Error::new(
                io::ErrorKind::Interrupted,
                "the run stopped",
            )),
            _ => Ok(()),
        }
    }

    fn chunk(&mut self) -> &mut [u8] {
        self.buf.slice(CHUNK)
    }

    /// The `len` bytes (at most [`CHUNK`]) of the entry stamped `stamp` that start at byte
    /// `offset` (a multiple of 4 KiB): noise, each 4 KiB block marked with the entry and
    /// its number.
    pub fn fill(&mut self, len: usize, stamp: u64, offset: u64) -> &[u8] {
        let chunk = &mut self.chunk()[..len];
        chunk.copy_from_slice(&noise()[..len]);
        for (i, block) in chunk.chunks_mut(BLOCK).enumerate() {
            let n = offset / BLOCK as u64 + i as u64;
            let mark = (stamp.rotate_left(17) ^ n).to_le_bytes();
            let k = block.len().min(8);
            block[..k].copy_from_slice(&mark[..k]);
        }
        chunk
    }
}

/// How a tier's files are opened.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileMode {
    /// Bypass the page cache (`O_DIRECT`; sizes padded to 4 KiB).
    pub direct: bool,
    /// `fdatasync` after each write (timed as device time).
    pub fsync: bool,
    /// Drop the file's cached pages before reading it, so a buffered read reaches the device.
    pub drop_cache_before_read: bool,
}

/// Writes an entry of `size` bytes; `stamp` makes its blocks distinct from every other
/// entry's.
pub fn write_entry(
    path: &Path,
    size: u64,
    stamp: u64,
    mode: FileMode,
    buf: &mut IoBuffer,
) -> io::Result<IoTime> {
    let began = Instant::now();
    if let Some(parent) = path.parent() {
        fs::create_dir_all(parent).map_err(|e| with_path(e, parent))?;
    }
    let mut file = open_object(path, true, mode.direct).map_err(|e| with_path(e, path))?;
    let total = io_len(size, mode.direct);
    let mut written = 0u64;
    while written < total {
        buf.check()?;
        let len = (total - written).min(CHUNK as u64) as usize;
        file.write_all(buf.fill(len, stamp, written))
            .map_err(|e| with_path(e, path))?;
        written += len as u64;
    }
    let host_s = began.elapsed().as_secs_f64();
    let synced = Instant::now();
    if mode.fsync {
        file.sync_data().map_err(|e| with_path(e, path))?;
    }
    Ok(IoTime {
        host_s,
        device_s: if mode.fsync {
            synced.elapsed().as_secs_f64()
        } else {
            0.0
        },
    })
}

/// Reads a whole entry back, chunk by chunk into the worker's buffer.
pub fn read_entry(
    path: &Path,
    size: u64,
    mode: FileMode,
    buf: &mut IoBuffer,
) -> io::Result<IoTime> {
    let began = Instant::now();
    let mut file = open_object(path, false, mode.direct).map_err(|e| with_path(e, path))?;
    if mode.drop_cache_before_read && !mode.direct {
        // SAFETY: a valid open descriptor; advice has no memory effects.
        unsafe {
            libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED);
        }
    }
    let host_s = began.elapsed().as_secs_f64();
    let reading = Instant::now();
    let total = io_len(size, mode.direct);
    let mut done = 0u64;
    while done < total {
        buf.check()?;
        let len = (total - done).min(CHUNK as u64) as usize;
        file.read_exact(&mut buf.chunk()[..len])
            .map_err(|e| with_path(e, path))?;
        done += len as u64;
    }
    Ok(IoTime {
        host_s,
        device_s: reading.elapsed().as_secs_f64(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvtrace_cache::storage::file::remove_object;

    #[test]
    fn entries_round_trip_and_their_blocks_are_distinct() {
        let dir = tempfile::tempdir().expect("tmp");
        let mut buf = IoBuffer::new();
        let mode = FileMode {
            direct: false,
            fsync: true,
            drop_cache_before_read: true,
        };
        let (a, b) = (dir.path().join("a/a.kv"), dir.path().join("b/b.kv"));
        let size = CHUNK as u64 + 12_345;
        write_entry(&a, size, 1, mode, &mut buf).expect("write a");
        write_entry(&b, size, 2, mode, &mut buf).expect("write b");
        assert_eq!(fs::metadata(&a).expect("a").len(), size);
        read_entry(&a, size, mode, &mut buf).expect("read");
        let (x, y) = (fs::read(&a).expect("a"), fs::read(&b).expect("b"));
        let blocks: std::collections::HashSet<&[u8]> =
            x.chunks(BLOCK).chain(y.chunks(BLOCK)).collect();
        assert_eq!(
            blocks.len(),
            x.len().div_ceil(BLOCK) * 2,
            "no block repeats"
        );
        let again = dir.path().join("c.kv");
        write_entry(&again, size, 1, mode, &mut buf).expect("rewrite");
        assert_eq!(
            fs::read(&again).expect("c"),
            x,
            "an entry's bytes depend on its stamp only"
        );
        remove_object(&a).expect("delete");
        remove_object(&a).expect("deleting twice is fine");
        assert!(read_entry(&a, size, mode, &mut buf).is_err());
    }
}
