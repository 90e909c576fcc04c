//! Limits on what an untrusted text input may make kvtrace hold at once. A reader wrapped in
//! [`LineLimit`] refuses a line longer than its limit with an error naming the line, instead
//! of growing a buffer for as long as the input keeps from ending it (`/dev/zero` never does);
//! [`read_text`] does the same for a file read whole, and [`read_json`] for a JSON report.

use std::fs::File;
use std::io::{self, BufReader, Read};
use std::path::Path;

use crate::error::{Error, Result};

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

/// The largest request dataset or trace read whole (a ShareGPT list, a Weka trace): 4 GiB,
/// six times the public ShareGPT list.
pub const MAX_DATASET_BYTES: u64 = 4 << 30;

/// Reads a whole text file of at most `limit` bytes. A larger one, or a device or pipe that
/// goes on past it, is an error once `limit` bytes are read, not a buffer grown until memory
/// runs out.
pub fn read_text(path: &Path, limit: u64) -> io::Result<String> {
    String::from_utf8(read_bytes(path, limit)?).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            "stream did not contain valid UTF-8",
        )
    })
}

/// [`read_text`] of a file whose bytes need not be text.
pub fn read_bytes(path: &Path, limit: u64) -> io::Result<Vec<u8>> {
    let mut bytes = Vec::new();
    Bounded::new(File::open(path)?, limit).read_to_end(&mut bytes)?;
    Ok(bytes)
}

fn too_long(limit: u64) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("longer than {limit} bytes, the limit on this kind of file"),
    )
}

/// The largest report read (`diff`'s two, each input of `aggregate`): 1 GiB. A sweep point
/// takes about 16 KB of its JSON, so one file holds some 65,000 points.
pub const MAX_REPORT_BYTES: u64 = 1 << 30;

/// Parses a JSON document of at most `limit` bytes as it is read: the text is never held
/// whole, bytes that cannot begin a document (`/dev/zero`'s) are refused at once, and a
/// device or pipe that goes on past `limit` is refused there. The error names the file and,
/// for bad JSON, its line.
pub fn read_json(path: &Path, limit: u64) -> Result<serde_json::Value> {
    let shown = path.display();
    let file = File::open(path).map_err(|e| Error::io("cannot read", e).in_file(&shown))?;
    serde_json::from_reader(BufReader::new(Bounded::new(file, limit))).map_err(|e| {
        let error = if e.is_io() {
            Error::io("cannot read", e.into())
        } else {
            Error::line(e.line() as u64, "json", e.to_string())
        };
        error.in_file(&shown)
    })
}

/// A reader that fails once more than `limit` bytes were read: the one bound of every
/// whole-file read here.
struct Bounded<R> {
    inner: R,
    left: u64,
    limit: u64,
}

impl<R> Bounded<R> {
    fn new(inner: R, limit: u64) -> Bounded<R> {
        Bounded {
            inner,
            left: limit,
            limit,
        }
    }
}

impl<R: Read> Read for Bounded<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.left == 0 {
            // Past the limit only if there is more to read.
            return match self.inner.read(&mut [0])? {
                0 => Ok(0),
                _ => Err(too_long(self.limit)),
            };
        }
        let room = buf
            .len()
            .min(usize::try_from(self.left).unwrap_or(usize::MAX));
        let n = self.inner.read(&mut buf[..room])?;
        self.left -= n as u64;
        Ok(n)
    }
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

    #[test]
    fn a_report_is_parsed_up_to_its_limit_and_an_endless_one_refused() {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("r.json");
        let shown = path.display();
        std::fs::write(&path, "{\"a\": [1, 2]}\n").expect("write");
        let doc = read_json(&path, 14).expect("at the limit");
        assert_eq!(doc, serde_json::json!({"a": [1, 2]}));
        let err = read_json(&path, 13)
            .expect_err("past the limit")
            .to_string();
        assert_eq!(
            err,
            format!("{shown}: cannot read: longer than 13 bytes, the limit on this kind of file")
        );
        std::fs::write(&path, "{\"a\":\n [1, }").expect("write");
        let err = read_json(&path, 1 << 10).expect_err("bad JSON").to_string();
        assert!(
            err.starts_with(&format!("{shown}: line 2: json: ")),
            "{err}"
        );
        // Bytes that cannot begin a document end the read at once; whitespace that never
        // ends, at the limit.
        let err = read_json(Path::new("/dev/zero"), 1 << 40).expect_err("zeros");
        assert!(
            err.to_string().contains("line 1: json: expected value"),
            "{err}"
        );
        let spaces = dir.path().join("spaces.json");
        std::fs::write(&spaces, " ".repeat(5000)).expect("write");
        let err = read_json(&spaces, 4096).expect_err("endless").to_string();
        assert!(
            err.ends_with("longer than 4096 bytes, the limit on this kind of file"),
            "{err}"
        );
    }
}
