//! Output files that never destroy what they replace before they are complete: each is
//! written under a temporary name in its own directory and renamed into place when it is
//! finished, so a crash, a full disk or an interrupt leaves the previous file (or none), a
//! symlink at the destination is replaced rather than followed, and readers never see half a
//! report. Inputs are told apart from outputs by device and inode, not by spelling.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::{Error, Result};

/// A file being written under a temporary name beside `dest`; [`OutputFile::commit`] renames
/// it into place, dropping it uncommitted removes it.
pub struct OutputFile {
    file: File,
    temp: PathBuf,
    dest: PathBuf,
    committed: bool,
}

static SERIAL: AtomicU64 = AtomicU64::new(0);

fn temp_path(dest: &Path) -> PathBuf {
    let name = dest
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let serial = SERIAL.fetch_add(1, Ordering::Relaxed);
    dest.with_file_name(format!(
        ".{name}.kvtrace-{}-{serial}.tmp",
        std::process::id()
    ))
}

impl OutputFile {
    /// Starts `dest`: creates the temporary file (never an existing one) in its directory.
    pub fn create(dest: &Path) -> Result<OutputFile> {
        let shown = dest.display().to_string();
        if dest.is_dir() {
            return Err(Error::usage("is a directory, not a file").in_file(&shown));
        }
        let temp = temp_path(dest);
        let file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&temp)
            .map_err(|e| Error::io("cannot create", e).in_file(&shown))?;
        Ok(OutputFile {
            file,
            temp,
            dest: dest.to_path_buf(),
            committed: false,
        })
    }

    /// Flushes the data to disk and renames the file into place.
    pub fn commit(mut self) -> io::Result<()> {
        self.file.sync_all()?;
        fs::rename(&self.temp, &self.dest)?;
        self.committed = true;
        Ok(())
    }
}

impl Drop for OutputFile {
    fn drop(&mut self) {
        if !self.committed {
            let _ = fs::remove_file(&self.temp);
        }
    }
}

impl Write for OutputFile {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.file.write(buf)
    }

    fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        self.file.write_all(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.file.flush()
    }
}

/// Writes a whole file at once, through a temporary name; an error names `dest`.
pub fn write_atomic(dest: &Path, bytes: &[u8]) -> Result<()> {
    let shown = dest.display().to_string();
    let mut out = OutputFile::create(dest)?;
    out.write_all(bytes)
        .and_then(|()| out.commit())
        .map_err(|e| Error::io("cannot write", e).in_file(&shown))
}

/// Checks before a long run that `dest` can be written: its directory takes a new file.
pub fn check_writable(dest: &Path) -> Result<()> {
    OutputFile::create(dest).map(drop)
}

/// The device and inode behind a path, `-` meaning standard input.
fn identity(path: &Path, stdin: bool) -> Option<(u64, u64)> {
    let meta = if path.as_os_str() == "-" {
        if !stdin {
            return None;
        }
        fs::metadata("/dev/stdin").ok()?
    } else {
        fs::metadata(path).ok()?
    };
    Some((meta.dev(), meta.ino()))
}

/// Whether the input (`-` for standard input) and the output (`-` for standard output) are
/// one file: the same device and inode, whatever links or spellings lead there.
pub fn same_file(input: &Path, output: &Path) -> bool {
    match (identity(input, true), identity(output, false)) {
        (Some(a), Some(b)) => a == b,
        _ => false,
    }
}

/// Refuses to write over an input, naming it.
pub fn refuse_overwrite(input: &Path, output: &Path) -> Result<()> {
    if same_file(input, output) {
        return Err(Error::usage(format!(
            "input and output are the same file ({}); refusing to overwrite it",
            output.display()
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_uncommitted_file_leaves_the_old_one_and_no_temporary() {
        let dir = tempfile::tempdir().expect("tmp");
        let dest = dir.path().join("report.json");
        fs::write(&dest, b"old").expect("old");
        let mut out = OutputFile::create(&dest).expect("create");
        out.write_all(b"new").expect("write");
        drop(out);
        assert_eq!(fs::read(&dest).expect("read"), b"old");
        assert_eq!(fs::read_dir(dir.path()).expect("dir").count(), 1);
        write_atomic(&dest, b"new").expect("write");
        assert_eq!(fs::read(&dest).expect("read"), b"new");
    }

    #[test]
    fn a_symlink_at_the_destination_is_replaced_not_followed() {
        let dir = tempfile::tempdir().expect("tmp");
        let target = dir.path().join("precious");
        fs::write(&target, b"keep").expect("target");
        let link = dir.path().join("out.csv");
        std::os::unix::fs::symlink(&target, &link).expect("link");
        write_atomic(&link, b"report").expect("write");
        assert_eq!(fs::read(&target).expect("target"), b"keep");
        assert!(!fs::symlink_metadata(&link).expect("m").is_symlink());
    }

    #[test]
    fn hard_links_are_the_same_file() {
        let dir = tempfile::tempdir().expect("tmp");
        let a = dir.path().join("a.lct");
        fs::write(&a, b"x").expect("a");
        let b = dir.path().join("b.lct");
        fs::hard_link(&a, &b).expect("link");
        assert!(same_file(&a, &b));
        assert!(!same_file(&a, &dir.path().join("c.lct")));
    }
}
