//! The `file` tier: one real file per object under a directory.
//!
//! File names come from the 128-bit hash of the object key (`ab/ab12…ef.kv`), never from the
//! key's bytes, so a hostile key (`../`, NUL, 4 KiB long) cannot reach outside the directory.
//! Objects are written as zero payloads, as LMCache's replay leaves reserved memory; reads copy
//! the whole object back. With `direct`, I/O bypasses the page cache (`O_DIRECT`, sizes padded
//! to 4 KiB), which is what a capacity plan for NVMe wants measured.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};

use super::backend::Backend;
use super::{KeyId, KeyMap};

/// When written objects are made durable.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FsyncPolicy {
    /// Leave it to the kernel.
    Never,
    /// `fdatasync` after every object.
    EveryWrite,
}

const ALIGN: usize = 4096;

/// A reusable buffer whose usable slice starts on a 4 KiB boundary (needed by `O_DIRECT`).
pub struct AlignedBuf {
    raw: Vec<u8>,
}

impl AlignedBuf {
    /// A buffer already large enough for `len` bytes.
    pub fn with_len(len: usize) -> AlignedBuf {
        let mut buf = AlignedBuf { raw: Vec::new() };
        buf.slice(len);
        buf
    }

    /// The first `len` aligned bytes, growing the buffer if needed.
    pub fn slice(&mut self, len: usize) -> &mut [u8] {
        if self.raw.len() < len + ALIGN {
            self.raw = vec![0u8; len + ALIGN];
        }
        let offset = self.raw.as_ptr().align_offset(ALIGN).min(ALIGN);
        &mut self.raw[offset..offset + len]
    }
}

pub struct FileTier {
    dir: PathBuf,
    direct: bool,
    fsync: FsyncPolicy,
    sizes: KeyMap<u64>,
    buf: AlignedBuf,
}

/// Where an object lives under `dir`: a fan-out directory and the key hash, nothing from
/// the key's own bytes.
pub fn object_path(dir: &Path, key: KeyId) -> PathBuf {
    let hex = key.hex();
    dir.join(&hex[..2]).join(format!("{hex}.kv"))
}

/// Bytes moved for an object of `size`: `O_DIRECT` I/O is padded to whole 4 KiB blocks.
pub fn io_len(size: u64, direct: bool) -> u64 {
    if direct {
        size.div_ceil(ALIGN as u64) * ALIGN as u64
    } else {
        size
    }
}

/// Opens an object file for a whole write (created, truncated) or a read.
pub fn open_object(path: &Path, write: bool, direct: bool) -> io::Result<File> {
    let mut options = OpenOptions::new();
    if write {
        options.write(true).create(true).truncate(true);
    } else {
        options.read(true);
    }
    if direct {
        use std::os::unix::fs::OpenOptionsExt;
        options.custom_flags(libc::O_DIRECT);
    }
    options.open(path)
}

/// Removes an object file; one already gone is fine.
pub fn remove_object(path: &Path) -> io::Result<()> {
    match fs::remove_file(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(with_path(e, path)),
        _ => Ok(()),
    }
}

impl FileTier {
    /// Creates the directory if needed and checks that files can be written in it.
    pub fn create(dir: &Path, direct: bool, fsync: FsyncPolicy) -> io::Result<FileTier> {
        fs::create_dir_all(dir).map_err(|e| with_path(e, dir))?;
        let probe = dir.join(".kvtrace-write-test");
        File::create(&probe)
            .and_then(|mut f| f.write_all(b"ok"))
            .map_err(|e| with_path(e, dir))?;
        fs::remove_file(&probe).map_err(|e| with_path(e, &probe))?;
        Ok(FileTier {
            dir: dir.to_path_buf(),
            direct,
            fsync,
            sizes: Default::default(),
            buf: AlignedBuf::with_len(0),
        })
    }

    /// Where an object lives.
    pub fn path_of(&self, key: KeyId) -> PathBuf {
        object_path(&self.dir, key)
    }
}

/// An I/O error that names the file.
pub fn with_path(e: io::Error, path: &Path) -> io::Error {
    io::Error::new(e.kind(), format!("{}: {e}", path.display()))
}

impl Backend for FileTier {
    fn name(&self) -> &'static str {
        if self.direct {
            "file (O_DIRECT)"
        } else {
            "file"
        }
    }

    fn put(&mut self, key: KeyId, size: u64) -> io::Result<()> {
        let path = self.path_of(key);
        if let Some(parent) = path.parent() {
            fs::create_dir_all(parent).map_err(|e| with_path(e, parent))?;
        }
        let len = io_len(size, self.direct) as usize;
        let mut file = open_object(&path, true, self.direct).map_err(|e| with_path(e, &path))?;
        let data = self.buf.slice(len);
        data.fill(0);
        let written = file.write_all(data).and_then(|()| match self.fsync {
            FsyncPolicy::EveryWrite => file.sync_data(),
            FsyncPolicy::Never => Ok(()),
        });
        if let Err(e) = written {
            // A full disk or an I/O error leaves no partial object behind.
            drop(file);
            let _ = fs::remove_file(&path);
            return Err(with_path(e, &path));
        }
        self.sizes.insert(key, size);
        Ok(())
    }

    fn get(&mut self, key: KeyId) -> io::Result<bool> {
        let Some(&size) = self.sizes.get(&key) else {
            return Ok(false);
        };
        let path = self.path_of(key);
        let len = io_len(size, self.direct) as usize;
        let mut file = match open_object(&path, false, self.direct) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
            Err(e) => return Err(with_path(e, &path)),
        };
        file.read_exact(self.buf.slice(len))
            .map_err(|e| with_path(e, &path))?;
        Ok(true)
    }

    fn delete(&mut self, key: KeyId) -> io::Result<()> {
        if self.sizes.remove(&key).is_some() {
            remove_object(&self.path_of(key))?;
        }
        Ok(())
    }

    fn contains(&self, key: KeyId) -> bool {
        self.sizes.contains_key(&key)
    }
}
