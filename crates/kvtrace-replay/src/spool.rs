//! Replay reads its trace more than once (the header, the eviction-phase estimate, the replay
//! itself), which a pipe or a FIFO cannot give: such an input is copied once into a temporary
//! file, removed again when the replay is done.

use std::fs::{self, File, OpenOptions};
use std::io;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// A trace that can be opened again and again.
pub struct Spooled {
    path: PathBuf,
    temporary: bool,
}

impl Spooled {
    /// `path` itself when it is a regular file, else a copy of its bytes in the temporary
    /// directory (`TMPDIR`).
    pub fn open(path: &Path) -> Result<Spooled> {
        let shown = path.display().to_string();
        let meta = fs::metadata(path).map_err(|e| Error::io("cannot open", e).in_file(&shown))?;
        if meta.is_file() {
            return Ok(Spooled {
                path: path.to_path_buf(),
                temporary: false,
            });
        }
        let mut source =
            File::open(path).map_err(|e| Error::io("cannot open", e).in_file(&shown))?;
        let copy = std::env::temp_dir().join(format!("kvtrace-spool-{}.lct", std::process::id()));
        let spooled = Spooled {
            path: copy,
            temporary: true,
        };
        let mut sink = OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&spooled.path)
            .map_err(|e| Error::io("cannot create", e).in_file(spooled.path.display()))?;
        io::copy(&mut source, &mut sink).map_err(|e| {
            Error::io("cannot copy the trace to a temporary file", e).in_file(&shown)
        })?;
        Ok(spooled)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for Spooled {
    fn drop(&mut self) {
        if self.temporary {
            let _ = fs::remove_file(&self.path);
        }
    }
}
