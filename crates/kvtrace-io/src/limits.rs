//! Limits on what an untrusted text input may make kvtrace hold at once. A reader wrapped in
//! [`LineLimit`] refuses a line longer than its limit with an error naming the line, instead
//! of growing a buffer for as long as the input keeps from ending it (`/dev/zero` never does);
//! [`read_text`] does the same for a file read whole.

use std::fs::File;
use std::io::{self, Read};
use std::path::Path;

/// The longest line of a text input (a Mooncake row, a BurstGPT CSV row): 16 MiB, far past
/// any real row (a prompt of a million chunks' ids fits in 9 MB).
pub const MAX_LINE_BYTES: usize = 16 << 20;

/// The most `hash_ids` one request row may name: 100,000 chunks (51 million tokens at 512
/// per chunk). Kept so that a row's LMCT record stays far below the frame size every reader
/// accepts by default.
pub const MAX_HASH_IDS_PER_ROW: usize = 100_000;

/// The largest configuration file read whole (a YAML prediction, a TOML tier hierarchy, an
/// engine's JSON arguments, a calibration report): 64 MiB, far past any real one.
pub const MAX_CONFIG_BYTES: u64 = 64 << 20;

/// Reads a whole text file of at most `limit` bytes. A larger one, or a device or pipe that
/// goes on past it, is an error once `limit` bytes are read, not a buffer grown until memory
/// runs out.
pub fn read_text(path: &Path, limit: u64) -> io::Result<String> {
    let mut text = String::new();
    File::open(path)?
        .take(limit.saturating_add(1))
        .read_to_string(&mut text)?;
    if text.len() as u64 > limit {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("longer than {limit} bytes, the limit on this kind of file"),
        ));
    }
    Ok(text)
}

/// A reader that fails once a line runs past `limit` bytes without a newline.
pub struct LineLimit<R> {
    inner: R,
    limit: usize,
    /// Bytes since the last newline.
    run: usize,
    /// The 1-based number of the line being read.
    line: u64,
}

impl<R: Read> LineLimit<R> {
    pub fn new(inner: R, limit: usize) -> LineLimit<R> {
        LineLimit {
            inner,
            limit,
            run: 0,
            line: 1,
        }
    }
}

impl<R: Read> Read for LineLimit<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        for &b in &buf[..n] {
            if b == b'\n' {
                self.run = 0;
                self.line += 1;
            } else {
                self.run += 1;
                if self.run > self.limit {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!(
                            "line {} is longer than {} bytes (the limit on a line)",
                            self.line, self.limit
                        ),
                    ));
                }
            }
        }
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_endless_line_is_refused_and_short_ones_pass() {
        let mut ok = String::new();
        LineLimit::new("ab\ncd\n".as_bytes(), 2)
            .read_to_string(&mut ok)
            .expect("short lines");
        assert_eq!(ok, "ab\ncd\n");
        let err = LineLimit::new(io::repeat(0).take(1 << 20), 1000)
            .read_to_end(&mut Vec::new())
            .expect_err("endless");
        assert!(
            err.to_string().contains("line 1 is longer than 1000 bytes"),
            "{err}"
        );
    }

    #[test]
    fn a_whole_file_is_read_up_to_its_limit_and_an_endless_one_refused() {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("t.toml");
        std::fs::write(&path, "a = 1\n").expect("write");
        assert_eq!(read_text(&path, 6).expect("at the limit"), "a = 1\n");
        let err = read_text(&path, 5).expect_err("past the limit");
        assert!(err.to_string().starts_with("longer than 5 bytes"), "{err}");
        let err = read_text(Path::new("/dev/zero"), 1 << 16).expect_err("endless");
        assert_eq!(err.kind(), io::ErrorKind::InvalidData, "{err}");
    }
}
