//! Output files that never destroy what they replace before they are complete: each is
//! written under a temporary name in its own directory and renamed into place when it is
//! finished, so a crash, a full disk or an interrupt leaves the previous file (or none), a
//! symlink at the destination is replaced rather than followed, and readers never see half a
//! report. Inputs are told apart from outputs by device and inode, not by spelling. A
//! destination that is a character device or a pipe (`/dev/null`, a FIFO), or an open
//! descriptor by name (`/dev/stdout`, `/dev/fd/3`), is written into instead: renaming over it
//! would put a plain file where the device or the link was.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use crate::error::{Error, Result};

/// A file being written under a temporary name beside `dest`; [`OutputFile::commit`] renames
/// it into place, dropping it uncommitted removes it.
pub struct OutputFile {
    file: File,
    /// `None` where `dest` is written in place (see [`in_place`]).
    temp: Option<PathBuf>,
    dest: PathBuf,
    committed: bool,
}

/// Whether `dest` is a character device or a pipe (through links), or names an open
/// descriptor, which an output is written into, not renamed over; an error for the other
/// special files.
fn in_place(dest: &Path) -> Result<bool> {
    use std::os::unix::fs::FileTypeExt;
    let Ok(meta) = fs::metadata(dest) else {
        return Ok(false);
    };
    let kind = meta.file_type();
    if kind.is_block_device() || kind.is_socket() {
        return Err(Error::usage("is a block device or a socket, not a file")
            .in_file(dest.display().to_string()));
    }
    Ok(kind.is_char_device() || kind.is_fifo() || names_descriptor(dest))
}

/// Whether `path`, through at most eight links, is an open descriptor's name
/// (`/dev/stdout` is a link to `/proc/self/fd/1`): standard output redirected to a file
/// (`> out.json`) is a regular file there, and a rename would replace `/dev/stdout` itself.
fn names_descriptor(path: &Path) -> bool {
    let mut path = path.to_path_buf();
    for _ in 0..8 {
        if ["/proc/self/fd/", "/proc/thread-self/fd/", "/dev/fd/"]
            .iter()
            .any(|dir| path.starts_with(dir))
        {
            return true;
        }
        match fs::read_link(&path) {
            Ok(target) => {
                path = match path.parent() {
                    Some(parent) if target.is_relative() => parent.join(target),
                    _ => target,
                }
            }
            Err(_) => return false,
        }
    }
    false
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

/// Whether `path` has the name [`OutputFile`] gives a file being written
/// (`.NAME.kvtrace-PID-N.tmp`): an output whose process never finished it.
pub fn is_temporary(path: &Path) -> bool {
    temporary_owner(path).is_some()
}

/// The process id in a temporary output's name.
fn temporary_owner(path: &Path) -> Option<u32> {
    temporary_owner_of(path.file_name()?.to_str()?)
}

fn temporary_owner_of(name: &str) -> Option<u32> {
    let rest = name.strip_prefix('.')?.strip_suffix(".tmp")?;
    let (_, tail) = rest.rsplit_once(".kvtrace-")?;
    let (pid, serial) = tail.split_once('-')?;
    serial.parse::<u64>().ok()?;
    pid.parse().ok()
}

/// Whether process `pid` is alive on this machine (signal 0 reaches it, or it exists but is
/// not ours to signal).
pub fn process_alive(pid: u32) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return false;
    };
    if pid <= 0 {
        return false;
    }
    // SAFETY: signal 0 checks for the process and delivers nothing.
    let sent = unsafe { libc::kill(pid, 0) };
    sent == 0 || io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

/// Removes the temporary outputs (`.NAME.kvtrace-PID-N.tmp`) a kvtrace process that is no
/// longer alive left in `dir` (killed before it could clean up); one line per removal.
pub fn remove_dead_temporaries(dir: &Path) -> Vec<String> {
    remove_dead_leftovers(dir, Leftover::File, "kvtrace process", temporary_owner_of)
}

/// What a dead process left: a file or a whole directory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Leftover {
    File,
    Dir,
}

/// Removes each entry of `dir` of the `kind` asked whose name `owner` reads a process id from
/// and whose process is no longer alive; one line per removal, naming `who` left it.
pub fn remove_dead_leftovers(
    dir: &Path,
    kind: Leftover,
    who: &str,
    owner: impl Fn(&str) -> Option<u32>,
) -> Vec<String> {
    let Ok(listing) = fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut notes = Vec::new();
    for entry in listing.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(&owner) else {
            continue;
        };
        let path = entry.path();
        let is_kind = entry.file_type().is_ok_and(|t| match kind {
            Leftover::File => t.is_file(),
            Leftover::Dir => t.is_dir(),
        });
        let removed = || match kind {
            Leftover::File => fs::remove_file(&path).is_ok(),
            Leftover::Dir => fs::remove_dir_all(&path).is_ok(),
        };
        if is_kind && !process_alive(pid) && removed() {
            notes.push(format!(
                "removed {}, left by {who} {pid}, which is no longer running",
                path.display()
            ));
        }
    }
    notes
}

impl OutputFile {
    /// Starts `dest`: creates the temporary file (never an existing one) in its directory.
    pub fn create(dest: &Path) -> Result<OutputFile> {
        let shown = dest.display().to_string();
        if dest.is_dir() {
            return Err(Error::usage("is a directory, not a file").in_file(&shown));
        }
        refuse_input(dest)?;
        if in_place(dest)? {
            // Appending: a descriptor redirected to a file keeps what is there (`>>`, or
            // this run's own lines before), as a shell's `>>` would.
            let file = OpenOptions::new()
                .append(true)
                .open(dest)
                .map_err(|e| Error::io("cannot open", e).in_file(&shown))?;
            return Ok(OutputFile {
                file,
                temp: None,
                dest: dest.to_path_buf(),
                committed: false,
            });
        }
        let temp = temp_path(dest);
        let file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&temp)
            .map_err(|e| Error::io("cannot create", e).in_file(&shown))?;
        Ok(OutputFile {
            file,
            temp: Some(temp),
            dest: dest.to_path_buf(),
            committed: false,
        })
    }

    /// Flushes the data to disk and renames the file into place (a device or a pipe has
    /// had every byte already).
    pub fn commit(mut self) -> io::Result<()> {
        let Some(temp) = &self.temp else {
            self.committed = true;
            return self.file.flush();
        };
        self.file.sync_all()?;
        if refuse_input(&self.dest).is_err() {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                "it is one of this run's inputs; refusing to overwrite it",
            ));
        }
        fs::rename(temp, &self.dest)?;
        self.committed = true;
        Ok(())
    }
}

impl Drop for OutputFile {
    fn drop(&mut self) {
        if let (false, Some(temp)) = (self.committed, &self.temp) {
            let _ = fs::remove_file(temp);
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

/// Checks before a long run that `dest` can be written: its directory takes a new file. A
/// device or a pipe is not opened: a pipe's reader would see the check's close as the end.
pub fn check_writable(dest: &Path) -> Result<()> {
    if in_place(dest)? {
        return refuse_input(dest);
    }
    OutputFile::create(dest).map(drop)
}

/// A directory's report set being written by this process: an exclusive lock on
/// `DIR/.kvtrace.lock`, so two runs into one directory never mix their files. Dropping it
/// removes the file and releases the lock; a process that dies releases it too (the kernel
/// drops the lock with the descriptor), leaving an unlocked file the next run takes.
pub struct DirLock {
    /// Holds the lock until the lock file is removed, then releases it.
    _file: File,
    path: PathBuf,
    /// The directories the lock created, deepest first: removed again when they are still
    /// empty, so a run refused after taking the lock leaves no trace of itself.
    created: Vec<PathBuf>,
}

impl Drop for DirLock {
    fn drop(&mut self) {
        // Removed while still locked: a run that opened it meanwhile finds it unlinked when
        // it checks, and starts over on a new file.
        let _ = fs::remove_file(&self.path);
        for dir in &self.created {
            if fs::remove_dir(dir).is_err() {
                break;
            }
        }
    }
}

/// Creates the directory `dir` and those it lacks above it. Where `dir` is a file or a
/// device, the error says "not a directory", not the "File exists" the system answers.
pub fn create_dir(dir: &Path) -> Result<()> {
    fs::create_dir_all(dir).map_err(|e| {
        let e = if e.kind() == io::ErrorKind::AlreadyExists && !dir.is_dir() {
            io::Error::from(io::ErrorKind::NotADirectory)
        } else {
            e
        };
        Error::io("cannot create", e).in_file(dir.display())
    })
}

impl DirLock {
    /// Takes the lock, or fails at once with one line when another run holds it.
    pub fn acquire(dir: &Path) -> Result<DirLock> {
        use std::os::fd::AsRawFd;
        let shown = dir.display().to_string();
        let created: Vec<PathBuf> = dir
            .ancestors()
            .take_while(|d| !d.as_os_str().is_empty() && !d.exists())
            .map(Path::to_path_buf)
            .collect();
        create_dir(dir)?;
        let path = dir.join(".kvtrace.lock");
        loop {
            let file = OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(&path)
                .map_err(|e| Error::io("cannot create", e).in_file(path.display()))?;
            // SAFETY: flock on a descriptor this function owns; no memory is shared.
            let locked = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
            if locked != 0 {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::WouldBlock {
                    return Err(Error::usage(
                        "another kvtrace run is writing its reports here; give each run its own output directory",
                    )
                    .in_file(&shown));
                }
                return Err(Error::io("cannot lock", e).in_file(path.display()));
            }
            // The file locked must still be the one at the path (not one a finishing run
            // has just removed).
            let held = file.metadata().map(|m| (m.dev(), m.ino())).ok();
            let named = fs::metadata(&path).map(|m| (m.dev(), m.ino())).ok();
            if held.is_some() && held == named {
                return Ok(DirLock {
                    _file: file,
                    path,
                    created,
                });
            }
        }
    }
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
        return Err(overwrite_error(output));
    }
    Ok(())
}

fn overwrite_error(output: &Path) -> Error {
    Error::usage(format!(
        "input and output are the same file ({}); refusing to overwrite it",
        output.display()
    ))
}

/// The files this process reads, by device and inode: no [`OutputFile`] is created over one
/// or renamed onto one, whatever path the output was given by.
static INPUTS: Mutex<Vec<(u64, u64)>> = Mutex::new(Vec::new());

/// The one check every command makes before any work: registers `inputs` (`-` for standard
/// input) as files no output of this process may replace, and refuses each of `outputs`
/// that is one of them. Outputs named later (a report directory's files) are checked when
/// they are created and again when they are renamed into place. Temporary files a dead
/// kvtrace process left beside the outputs are removed; the notes say which.
pub fn guard_inputs<'a>(
    inputs: impl IntoIterator<Item = &'a Path>,
    outputs: impl IntoIterator<Item = &'a Path>,
) -> Result<Vec<String>> {
    {
        let mut known = INPUTS.lock().unwrap_or_else(|e| e.into_inner());
        for input in inputs {
            if let Some(id) = identity(input, true) {
                if !known.contains(&id) {
                    known.push(id);
                }
            }
        }
    }
    let mut notes = Vec::new();
    for output in outputs {
        refuse_input(output)?;
        let dir = match output.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => Path::new("."),
        };
        notes.extend(remove_dead_temporaries(dir));
    }
    Ok(notes)
}

/// Refuses `output` when it is (through links or another spelling) a registered input.
fn refuse_input(output: &Path) -> Result<()> {
    let Some(id) = identity(output, false) else {
        return Ok(());
    };
    if INPUTS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .contains(&id)
    {
        return Err(overwrite_error(output));
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

    fn fifo(path: &Path) {
        let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).expect("c");
        // SAFETY: a NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    }

    /// Renamed over, a FIFO (or `/dev/null` behind a link) would become a plain file and its
    /// reader would see nothing.
    #[test]
    fn a_pipe_or_a_device_is_written_in_place_not_replaced() {
        use std::os::unix::fs::FileTypeExt;
        let dir = tempfile::tempdir().expect("tmp");
        let pipe = dir.path().join("report.json");
        fifo(&pipe);
        let at = pipe.clone();
        let reader = std::thread::spawn(move || fs::read(at));
        check_writable(&pipe).expect("a pipe is not opened to check it");
        write_atomic(&pipe, b"report").expect("write");
        // Before the join: a reader of a pipe no one opened would wait for ever.
        assert!(fs::metadata(&pipe).expect("m").file_type().is_fifo());
        assert_eq!(reader.join().expect("reader").expect("read"), b"report");
        let null = dir.path().join("null.json");
        std::os::unix::fs::symlink("/dev/null", &null).expect("link");
        write_atomic(&null, b"report").expect("write");
        assert!(fs::symlink_metadata(&null).expect("m").is_symlink());
        assert_eq!(
            fs::read_dir(dir.path()).expect("dir").count(),
            2,
            "no temporary"
        );
    }

    #[test]
    fn a_full_device_is_an_error_naming_it() {
        if !Path::new("/dev/full").exists() {
            eprintln!("skipped: this system has no /dev/full");
            return;
        }
        let dir = tempfile::tempdir().expect("tmp");
        let full = dir.path().join("out.lct");
        std::os::unix::fs::symlink("/dev/full", &full).expect("link");
        let err = write_atomic(&full, &[0; 8192]).expect_err("ENOSPC");
        assert!(err.to_string().contains("out.lct"), "{err}");
        assert!(fs::symlink_metadata(&full).expect("m").is_symlink());
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
