//! Streaming LMCT reader over any byte source: a file, stdin or a zstd stream around either.
//!
//! It holds one frame at a time, so memory stays flat whatever the trace length. It follows
//! LMCache's reader where that is sound (a strict header, a clean end on a frame boundary,
//! undecodable records skipped) and goes further where LMCache loses information: every skip
//! and the truncated tail are counted and reported with their byte offsets, and a corrupt
//! length is refused before anything is allocated for it.

use std::fs::File;
use std::io::{self, BufRead, BufReader, Cursor, Read};
use std::path::Path;

use super::frame::{Header, HeaderSchema, RecordRef, RecordSpans};
use kvtrace_io::error::{Error, Result};

/// Largest frame accepted by default (64 MiB). LMCache frames are a few KiB.
pub const DEFAULT_MAX_FRAME_BYTES: u32 = 64 << 20;

/// The header error of a file that starts like kvtrace's JSON Lines form of a trace.
pub const JSON_LINES_TRACE: &str =
    "the JSON Lines form of a trace (`{\"type\":\"header\"…`), not LMCT bytes";

/// The header error of a file that starts with `{`: JSON text, such as a request trace.
pub const JSON_TEXT: &str = "JSON text, not an LMCT trace";

/// First bytes of a zstd frame.
pub const ZSTD_MAGIC: [u8; 4] = [0x28, 0xb5, 0x2f, 0xfd];

/// How many undecodable-record reasons are kept for the report.
pub(super) const KEPT_SKIP_REASONS: usize = 16;

#[derive(Clone, Copy, Debug)]
pub struct ReadOptions {
    /// Frames whose length prefix exceeds this are refused with an error.
    pub max_frame_bytes: u32,
    /// Threads that decode frames, for the operations whose output allows it (`info`); 0:
    /// one per core. Their results do not depend on it.
    pub threads: usize,
    /// Asked between blocks by the whole-file reads ([`crate::blocks::fold_frames`]); `true`
    /// ends the read where it is, with [`ReadSummary::interrupted`] set. The format knows no
    /// signals: a program that stops on SIGINT passes its own check (kvtrace passes
    /// `kvtrace_io::interrupt::stop_requested`); the default never stops.
    pub stop: fn() -> bool,
}

/// The most decoding threads a read starts, whatever it is asked for: past the blocks a read
/// has in flight more gain nothing, and thousands are more than a system lets one process
/// start (a refused thread was a panic).
pub const MAX_THREADS: usize = 1024;

/// The [`ReadOptions::stop`] that never stops.
fn never() -> bool {
    false
}

impl Default for ReadOptions {
    fn default() -> Self {
        ReadOptions {
            max_frame_bytes: DEFAULT_MAX_FRAME_BYTES,
            threads: 0,
            stop: never,
        }
    }
}

impl ReadOptions {
    /// The decoding threads to use.
    pub fn threads(&self) -> usize {
        match self.threads {
            0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
            n => n,
        }
        .min(MAX_THREADS)
    }
}

/// One frame after the header.
#[derive(Debug)]
pub enum Frame<'a> {
    Record(RecordRef<'a>),
    /// A frame whose length was sound but whose body LMCache could not decode either.
    Undecodable {
        offset: u64,
        body: &'a [u8],
        reason: String,
    },
}

impl Frame<'_> {
    /// Where the frame's length prefix starts in the (decompressed) stream.
    pub fn offset(&self) -> u64 {
        match self {
            Frame::Record(r) => r.offset,
            Frame::Undecodable { offset, .. } => *offset,
        }
    }
}

/// The incomplete frame at the end of a cut-off trace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Truncation {
    /// Offset of the incomplete frame's length prefix.
    pub offset: u64,
    /// Declared body length, when the whole prefix was present.
    pub declared: Option<u32>,
    /// Body bytes present (or prefix bytes, when the prefix itself is cut).
    pub available: u64,
    /// What the zstd layer reported, when the compressed stream itself ended early.
    pub cause: Option<String>,
    /// Every byte of the incomplete frame that was present, prefix included, so that a
    /// conversion can keep it.
    pub bytes: Vec<u8>,
}

impl std::fmt::Display for Truncation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.declared {
            Some(len) => write!(
                f,
                "truncated frame at byte {}: body declares {} bytes, {} present (body starts at byte {})",
                self.offset,
                len,
                self.available,
                self.offset + 4
            )?,
            None => write!(
                f,
                "truncated frame at byte {}: length prefix cut after {} of 4 bytes",
                self.offset, self.available
            )?,
        }
        if let Some(cause) = &self.cause {
            write!(f, " ({cause})")?;
        }
        Ok(())
    }
}

/// What a finished read saw besides the records themselves.
#[derive(Clone, Debug, Default)]
pub struct ReadSummary {
    pub records: u64,
    pub undecodable: u64,
    /// `(offset, reason)` of the first undecodable records.
    pub undecodable_examples: Vec<(u64, String)>,
    pub truncation: Option<Truncation>,
    /// Bytes consumed from the (decompressed) stream.
    pub bytes: u64,
    pub compressed: bool,
    /// A signal stopped the read before the end: the counts are of a prefix.
    pub interrupted: bool,
}

impl ReadSummary {
    /// The summary of a whole read made of `before` and this one, which went on from the
    /// frame where `before` stopped ([`TraceReader::skip_frames`]): the counts of both, the
    /// first skip reasons, and where and how this one ended.
    pub fn following(self, before: &ReadSummary) -> ReadSummary {
        let mut examples = before.undecodable_examples.clone();
        let room = KEPT_SKIP_REASONS.saturating_sub(examples.len());
        examples.extend(self.undecodable_examples.into_iter().take(room));
        ReadSummary {
            records: before.records + self.records,
            undecodable: before.undecodable + self.undecodable,
            undecodable_examples: examples,
            interrupted: before.interrupted || self.interrupted,
            ..self
        }
    }

    /// This read cut where a consumer of its records stopped, at the record at byte
    /// `offset`, having taken `records` of them (that one included): the undecodable frames
    /// before it, and no truncation, which the consumer never reached. The count is exact
    /// where the read listed every undecodable frame before the stop (it lists the first
    /// 16); past that, where the unlisted ones lie is not known, and all are counted.
    pub fn stopped_at(&self, offset: u64, records: u64) -> ReadSummary {
        let examples: Vec<(u64, String)> = self
            .undecodable_examples
            .iter()
            .filter(|(at, _)| *at < offset)
            .cloned()
            .collect();
        let all_listed = self.undecodable == self.undecodable_examples.len() as u64;
        let undecodable = if all_listed || examples.len() < self.undecodable_examples.len() {
            examples.len() as u64
        } else {
            self.undecodable
        };
        ReadSummary {
            records,
            undecodable,
            undecodable_examples: examples,
            truncation: None,
            bytes: offset.min(self.bytes),
            compressed: self.compressed,
            interrupted: self.interrupted,
        }
    }

    /// One line per condition a user should know about.
    pub fn warnings(&self) -> Vec<String> {
        let mut out = Vec::new();
        for (offset, reason) in &self.undecodable_examples {
            out.push(format!(
                "skipped undecodable record at byte {offset}: {reason}"
            ));
        }
        let unlisted = self.undecodable - self.undecodable_examples.len() as u64;
        if unlisted > 0 {
            out.push(format!("skipped {unlisted} more undecodable records"));
        }
        if let Some(t) = &self.truncation {
            out.push(t.to_string());
        }
        out
    }
}

/// Reads an LMCT stream frame by frame.
pub struct TraceReader {
    src: Box<dyn BufRead + Send>,
    header: Header,
    header_body: Vec<u8>,
    buf: Vec<u8>,
    /// Length of the current frame body.
    body_len: usize,
    /// The current frame lies whole in the source's buffer (after its length prefix) and is
    /// read there; otherwise its body was copied into `buf`.
    in_place: bool,
    /// Bytes of the source's buffer the current frame occupies, released on the next read.
    pending: usize,
    next_offset: u64,
    max_frame_bytes: u32,
    stop: fn() -> bool,
    done: bool,
    summary: ReadSummary,
}

fn note_undecodable(summary: &mut ReadSummary, offset: u64, reason: String) {
    summary.undecodable += 1;
    if summary.undecodable_examples.len() < KEPT_SKIP_REASONS {
        summary.undecodable_examples.push((offset, reason));
    }
}

/// The current frame's body: in the source's buffer, or copied out into `buf`.
fn current_body<'a>(
    src: &'a mut Box<dyn BufRead + Send>,
    buf: &'a [u8],
    in_place: bool,
    len: usize,
) -> &'a [u8] {
    if !in_place {
        return &buf[..len];
    }
    // The buffer still holds the frame (nothing was consumed since it was seen there), so
    // this returns it without reading.
    match src.fill_buf() {
        Ok(buffered) => buffered.get(4..4 + len).unwrap_or_default(),
        Err(_) => &[],
    }
}

fn read_fully(src: &mut dyn Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match src.read(&mut buf[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(got)
}

/// Reads up to `len` bytes into `buf`, growing it only as data actually arrives, so that a
/// corrupt length on a short stream allocates nothing close to `len`. `buf` keeps its size
/// between frames (no zero-filling per frame); the body is `buf[..returned]`.
fn read_body(src: &mut dyn Read, buf: &mut Vec<u8>, len: usize) -> io::Result<usize> {
    const STEP: usize = 1 << 20;
    let mut got = 0;
    while got < len {
        let want = (len - got).min(STEP.max(got));
        if buf.len() < got + want {
            buf.resize(got + want, 0);
        }
        let n = read_fully(src, &mut buf[got..got + want])?;
        got += n;
        if n < want {
            break;
        }
    }
    Ok(got)
}

impl TraceReader {
    /// Opens a trace file (plain or zstd) and reads its header.
    pub fn open(path: &Path, options: ReadOptions) -> Result<TraceReader> {
        let file = File::open(path).map_err(|e| Error::io("cannot open", e))?;
        TraceReader::from_reader(file, options)
    }

    /// [`TraceReader::open`], or standard input for `-`: what `info`, `dump` and `convert`
    /// take, which read a trace once from its start.
    pub fn open_or_stdin(path: &Path, options: ReadOptions) -> Result<TraceReader> {
        if path.as_os_str() == "-" {
            TraceReader::from_reader(std::io::stdin(), options)
        } else {
            TraceReader::open(path, options)
        }
    }

    /// Reads the header from any byte source; detects a zstd container by its magic.
    pub fn from_reader(src: impl Read + Send + 'static, options: ReadOptions) -> Result<Self> {
        let mut src = BufReader::with_capacity(1 << 18, src);
        let mut first = [0u8; 4];
        let n = read_fully(&mut src, &mut first).map_err(|e| Error::io("cannot read", e))?;
        let head = Cursor::new(first[..n].to_vec()).chain(src);
        let compressed = n == 4 && first == ZSTD_MAGIC;
        let src: Box<dyn BufRead + Send> = if compressed {
            let decoder =
                zstd::Decoder::new(head).map_err(|e| Error::io("cannot start zstd", e))?;
            Box::new(BufReader::with_capacity(1 << 18, decoder))
        } else {
            Box::new(head)
        };
        let mut reader = TraceReader {
            src,
            header: Header::storage(0.0, 0.0),
            header_body: Vec::new(),
            buf: Vec::new(),
            body_len: 0,
            in_place: false,
            pending: 0,
            next_offset: 0,
            max_frame_bytes: options.max_frame_bytes,
            stop: options.stop,
            done: false,
            summary: ReadSummary {
                compressed,
                ..ReadSummary::default()
            },
        };
        reader.read_header()?;
        Ok(reader)
    }

    fn read_header(&mut self) -> Result<()> {
        let mut prefix = [0u8; 4];
        let n = read_fully(&mut self.src, &mut prefix).map_err(|e| self.read_error(e))?;
        if n == 0 {
            return Err(Error::data(0, "header", "empty file: no header frame"));
        }
        if n < 4 {
            return Err(Error::data(
                0,
                "header",
                "file ends inside the header's length prefix",
            ));
        }
        // A JSON file given where a trace goes: say what it is, not that its "length" is huge.
        if prefix.starts_with(b"{\"ty") {
            return Err(Error::data(0, "header", JSON_LINES_TRACE));
        }
        if prefix[0] == b'{' {
            return Err(Error::data(0, "header", JSON_TEXT));
        }
        let len = u32::from_be_bytes(prefix);
        if len > self.max_frame_bytes {
            return Err(Error::data(
                0,
                "header length",
                format!(
                    "{len} bytes exceeds the frame limit of {} bytes; not an LMCT trace?",
                    self.max_frame_bytes
                ),
            ));
        }
        let got = read_body(&mut self.src, &mut self.header_body, len as usize)
            .map_err(|e| self.read_error(e))?;
        self.header_body.truncate(got);
        if got < len as usize {
            return Err(Error::data(
                0,
                "header",
                format!("header frame truncated: {got} of {len} bytes present"),
            ));
        }
        self.header =
            Header::parse(&self.header_body).map_err(|(field, msg)| Error::data(0, field, msg))?;
        self.next_offset = 4 + len as u64;
        self.summary.bytes = self.next_offset;
        Ok(())
    }

    fn read_error(&self, e: io::Error) -> Error {
        Error::io(format!("read failed near byte {}", self.next_offset), e)
    }

    pub fn header(&self) -> &Header {
        &self.header
    }

    /// The header frame's msgpack body as read.
    pub fn header_body(&self) -> &[u8] {
        &self.header_body
    }

    /// Warnings about the header itself (a schema version kvtrace does not know).
    pub fn header_warnings(&self) -> Vec<String> {
        match self.header.schema {
            HeaderSchema::Version(v) if !(1..=2).contains(&v) => vec![format!(
                "unknown trace_schema_version {v}: reading leniently, argument shapes may differ"
            )],
            _ => Vec::new(),
        }
    }

    /// Reads the next frame body: in place when the source's buffer holds all of it, else
    /// into `buf`. Returns its offset, or `None` at the end (clean, or a truncated tail
    /// recorded in the summary).
    fn read_next_body(&mut self) -> Result<Option<u64>> {
        if self.done {
            return Ok(None);
        }
        self.src.consume(std::mem::take(&mut self.pending));
        let offset = self.next_offset;
        match self.src.fill_buf() {
            Ok(buffered) => {
                if let Some(&[a, b, c, d]) = buffered.get(..4) {
                    let len = u32::from_be_bytes([a, b, c, d]);
                    if len <= self.max_frame_bytes && buffered.len() - 4 >= len as usize {
                        self.in_place = true;
                        self.body_len = len as usize;
                        self.pending = 4 + len as usize;
                        self.next_offset += 4 + len as u64;
                        self.summary.bytes = self.next_offset;
                        return Ok(Some(offset));
                    }
                }
            }
            // Retried by the copying path below, as every read is.
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return self.stream_failed(offset, Vec::new(), None, e),
        }
        self.in_place = false;
        let mut prefix = [0u8; 4];
        let n = match read_fully(&mut self.src, &mut prefix) {
            Ok(n) => n,
            Err(e) => return self.stream_failed(offset, Vec::new(), None, e),
        };
        if n == 0 {
            self.done = true;
            return Ok(None);
        }
        if n < 4 {
            self.done = true;
            self.summary.truncation = Some(Truncation {
                offset,
                declared: None,
                available: n as u64,
                cause: None,
                bytes: prefix[..n].to_vec(),
            });
            self.summary.bytes += n as u64;
            return Ok(None);
        }
        let len = u32::from_be_bytes(prefix);
        if len > self.max_frame_bytes {
            self.done = true;
            return Err(Error::data(
                offset,
                "frame length",
                format!(
                    "{len} bytes exceeds the frame limit of {} bytes (corrupt length prefix?)",
                    self.max_frame_bytes
                ),
            ));
        }
        let got = match read_body(&mut self.src, &mut self.buf, len as usize) {
            Ok(got) => got,
            Err(e) => {
                return self.stream_failed(offset, prefix.to_vec(), Some(len), e);
            }
        };
        if got < len as usize {
            self.done = true;
            let mut bytes = prefix.to_vec();
            bytes.extend_from_slice(&self.buf[..got]);
            self.summary.bytes += bytes.len() as u64;
            self.summary.truncation = Some(Truncation {
                offset,
                declared: Some(len),
                available: got as u64,
                cause: None,
                bytes,
            });
            return Ok(None);
        }
        self.body_len = got;
        self.next_offset += 4 + len as u64;
        self.summary.bytes = self.next_offset;
        Ok(Some(offset))
    }

    /// A read error: fatal on a plain stream; on a zstd stream it means the compressed data
    /// ended early or is corrupt, which is reported like a truncated tail.
    fn stream_failed(
        &mut self,
        offset: u64,
        bytes: Vec<u8>,
        declared: Option<u32>,
        e: io::Error,
    ) -> Result<Option<u64>> {
        self.done = true;
        if !self.summary.compressed {
            return Err(self.read_error(e));
        }
        let available = match declared {
            Some(_) => bytes.len().saturating_sub(4) as u64,
            None => bytes.len() as u64,
        };
        self.summary.truncation = Some(Truncation {
            offset,
            declared,
            available,
            cause: Some(format!("zstd stream ended early or is corrupt: {e}")),
            bytes,
        });
        Ok(None)
    }

    /// The next frame, decodable or not.
    pub fn next_frame(&mut self) -> Result<Option<Frame<'_>>> {
        let Some(offset) = self.read_next_body()? else {
            return Ok(None);
        };
        let body = current_body(&mut self.src, &self.buf, self.in_place, self.body_len);
        match RecordSpans::parse(body) {
            Ok(spans) => {
                self.summary.records += 1;
                Ok(Some(Frame::Record(RecordRef::from_spans(
                    offset, body, &spans,
                ))))
            }
            Err(reason) => {
                note_undecodable(&mut self.summary, offset, reason.clone());
                Ok(Some(Frame::Undecodable {
                    offset,
                    body,
                    reason,
                }))
            }
        }
    }

    /// Steps over the next `frames` frames without decoding or counting them (a read that
    /// goes on where an earlier read of the same file stopped); the frames stepped over,
    /// fewer where the stream ends first.
    pub fn skip_frames(&mut self, frames: u64) -> Result<u64> {
        let mut skipped = 0;
        while skipped < frames && self.read_next_body()?.is_some() {
            skipped += 1;
        }
        Ok(skipped)
    }

    /// The next decodable record; undecodable ones are skipped and counted.
    pub fn next_record(&mut self) -> Result<Option<RecordRef<'_>>> {
        loop {
            let Some(offset) = self.read_next_body()? else {
                return Ok(None);
            };
            // Spans hold offsets only, so the body is borrowed again for the record: a borrow
            // returned from one branch of a loop cannot also be the one checked.
            let body = current_body(&mut self.src, &self.buf, self.in_place, self.body_len);
            match RecordSpans::parse(body) {
                Ok(spans) => {
                    self.summary.records += 1;
                    let body = current_body(&mut self.src, &self.buf, self.in_place, self.body_len);
                    return Ok(Some(RecordRef::from_spans(offset, body, &spans)));
                }
                Err(reason) => note_undecodable(&mut self.summary, offset, reason),
            }
        }
    }

    /// Counts so far; complete once `next_*` has returned `None`.
    pub fn summary(&self) -> &ReadSummary {
        &self.summary
    }

    pub fn into_summary(self) -> ReadSummary {
        self.summary
    }

    /// The rest of the stream in blocks of whole frames, for readers that decode frames on
    /// several threads (see [`super::blocks`]).
    pub fn into_blocks(mut self, block_bytes: usize) -> super::blocks::Blocks {
        self.src.consume(std::mem::take(&mut self.pending));
        super::blocks::Blocks::new(
            self.src,
            self.next_offset,
            self.max_frame_bytes,
            self.stop,
            self.summary,
            block_bytes,
        )
    }
}

/// Reads the records that begin at `offsets` (ascending; each the offset of a frame that an
/// earlier read of the same file found decodable), for a reader that picks a few records out
/// of a whole read and needs them again: a plain file is read only around them; a zstd
/// stream, which cannot be entered in the middle, is read through, and only the frames at
/// `offsets` are handed on. A frame that is not there any more (the file changed since) is
/// an error at its offset.
pub fn read_records_at(
    path: &Path,
    options: ReadOptions,
    offsets: &[u64],
    each: &mut dyn FnMut(RecordRef<'_>) -> Result<()>,
) -> Result<()> {
    let changed = |offset: u64, what: &str| {
        Error::data(
            offset,
            "record",
            format!(
                "{what}, where an earlier read of this file found a record: did the file change?"
            ),
        )
    };
    let mut wanted = offsets.iter().copied().peekable();
    let mut file = File::open(path).map_err(|e| Error::io("cannot open", e))?;
    let mut magic = [0u8; 4];
    let n = read_fully(&mut file, &mut magic).map_err(|e| Error::io("cannot read", e))?;
    if n == 4 && magic == ZSTD_MAGIC {
        // Frames are split in blocks without being parsed; only the wanted ones are.
        let mut blocks = TraceReader::open(path, options)?.into_blocks(1 << 20);
        let mut buf = Vec::new();
        while let Some(&first) = wanted.peek() {
            let Some(block) = blocks.next_block(buf)? else {
                return Err(changed(first, "the trace ends before this byte"));
            };
            for (at, body) in block.frames() {
                match wanted.peek() {
                    Some(&offset) if at == offset => {
                        wanted.next();
                        let record = RecordRef::parse(offset, body).map_err(|reason| {
                            changed(offset, &format!("undecodable frame ({reason})"))
                        })?;
                        each(record)?;
                    }
                    Some(&offset) if at > offset => {
                        return Err(changed(offset, "no frame begins here"))
                    }
                    _ => {}
                }
            }
            buf = block.into_buffer();
        }
        return Ok(());
    }
    let mut file = BufReader::with_capacity(1 << 16, file);
    let (mut at, mut body) = (4u64, Vec::new());
    for offset in wanted {
        let step = i64::try_from(offset).unwrap_or(i64::MAX) - i64::try_from(at).unwrap_or(0);
        file.seek_relative(step)
            .map_err(|e| Error::io(format!("cannot seek to byte {offset}"), e))?;
        let mut prefix = [0u8; 4];
        let got = read_fully(&mut file, &mut prefix)
            .map_err(|e| Error::io(format!("read failed near byte {offset}"), e))?;
        let len = u32::from_be_bytes(prefix);
        if got < 4 || len > options.max_frame_bytes {
            return Err(changed(offset, "no frame begins here"));
        }
        let got = read_body(&mut file, &mut body, len as usize)
            .map_err(|e| Error::io(format!("read failed near byte {offset}"), e))?;
        if got < len as usize {
            return Err(changed(offset, "the trace ends inside this frame"));
        }
        at = offset + 4 + u64::from(len);
        let record = RecordRef::parse(offset, &body[..got])
            .map_err(|reason| changed(offset, &format!("undecodable frame ({reason})")))?;
        each(record)?;
    }
    Ok(())
}
