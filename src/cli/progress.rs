//! Progress on stderr for the commands that read or write whole traces, drawn only on a
//! terminal: a bar over the file's bytes (with rate and ETA) where the input is a plain
//! `.lct` of known size, or a bar over a known record count, else a spinner of records.

use std::fs::File;
use std::io::{IsTerminal, Read};
use std::path::Path;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use kvtrace::lmct::reader::ZSTD_MAGIC;

pub(super) use kvtrace::trace::PROGRESS_EVERY as EVERY;

pub(super) struct Progress {
    bar: ProgressBar,
    by_bytes: bool,
}

impl Progress {
    fn hidden() -> Progress {
        Progress {
            bar: ProgressBar::hidden(),
            by_bytes: false,
        }
    }

    /// Whether a bar is drawn at all: asked for, and stderr is a terminal.
    fn visible(shown: bool) -> bool {
        shown && std::io::stderr().is_terminal()
    }

    /// A bar drawn with `template`, or a hidden one where it would not be [`visible`].
    ///
    /// [`visible`]: Progress::visible
    fn drawn(shown: bool, len: Option<u64>, template: &str, by_bytes: bool) -> Progress {
        if !Progress::visible(shown) {
            return Progress::hidden();
        }
        let bar = ProgressBar::with_draw_target(len, ProgressDrawTarget::stderr());
        if let Ok(style) = ProgressStyle::with_template(template) {
            bar.set_style(style);
        }
        Progress { bar, by_bytes }
    }

    /// Over reading `path`: its bytes when it is a plain file (no second pass over it),
    /// records otherwise. Hidden when `shown` is false or stderr is not a terminal.
    pub(super) fn reading(path: &Path, shown: bool) -> Progress {
        if !Progress::visible(shown) {
            return Progress::hidden();
        }
        let mut magic = [0u8; 4];
        let plain_size = File::open(path).ok().and_then(|mut f| {
            let compressed = f.read_exact(&mut magic).is_ok() && magic == ZSTD_MAGIC;
            let meta = f.metadata().ok()?;
            (!compressed && meta.is_file()).then_some(meta.len())
        });
        match plain_size {
            Some(size) => Progress::drawn(
                shown,
                Some(size),
                "{bar:40} {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
                true,
            ),
            None => Progress::records(shown),
        }
    }

    /// A spinner of records, for an input whose size says little (a conversion's output
    /// grows at another rate than its input).
    pub(super) fn records(shown: bool) -> Progress {
        Progress::drawn(shown, None, "{spinner} {pos} records {per_sec}", false)
    }

    /// Over writing `total` records.
    pub(super) fn writing(total: u64, shown: bool) -> Progress {
        Progress::drawn(
            shown,
            Some(total),
            "{bar:40} {pos}/{len} records {per_sec} eta {eta}",
            false,
        )
    }

    /// Over the `total` points of a sweep.
    pub(super) fn points(total: u64, shown: bool) -> Progress {
        Progress::drawn(
            shown,
            Some(total),
            "{bar:40} {pos}/{len} points eta {eta}",
            false,
        )
    }

    /// One more item done.
    pub(super) fn inc(&self) {
        self.bar.inc(1);
    }

    /// Records done so far and the input's byte offset.
    pub(super) fn set(&self, records: u64, offset: u64) {
        self.bar
            .set_position(if self.by_bytes { offset } else { records });
    }

    pub(super) fn finish(&self) {
        self.bar.finish_and_clear();
    }
}
