//! `kvtrace convert`: LMCT ↔ lossless JSONL, plain ↔ zstd, and later schemas → schema 1.
//!
//! Without a schema change every conversion is lossless, including the parts LMCache would
//! drop: undecodable frames travel as `$frame_hex` lines and a truncated tail as a final
//! `$tail_hex` line, so `.lct → .jsonl → .lct` gives back the original bytes.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{self, BufRead, BufReader, BufWriter, Read, Write};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;

use serde::Deserialize;
use serde_json::Value as Json;

use super::{Progress, PROGRESS_EVERY};
use crate::error::{Error, Result};
use crate::lmct::blocks::{fold_frames, Spares};
use crate::lmct::json::{encode_lossless, from_lossless, Lossless, RawLossless};
use crate::lmct::msgpack::{encode, RawValue, MAX_DEPTH};
use crate::lmct::reader::ZSTD_MAGIC;
use crate::lmct::schema::Migration;
use crate::lmct::writer::zstd_encoder;
use crate::lmct::{write_frame, Frame, Header, ReadOptions, TraceReader, TraceSink, Value};

/// Bytes of frames each converting thread takes at a time.
const BLOCK_BYTES: usize = 1 << 20;

/// The three file kinds kvtrace converts between.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Lct,
    LctZstd,
    Jsonl,
}

impl Kind {
    /// The kind an output path asks for, by extension.
    pub fn from_path(path: &Path) -> Kind {
        let name = path.to_string_lossy();
        if name.ends_with(".jsonl") {
            Kind::Jsonl
        } else if name.ends_with(".zst") {
            Kind::LctZstd
        } else {
            Kind::Lct
        }
    }

    pub fn parse(name: &str) -> Option<Kind> {
        match name {
            "lct" => Some(Kind::Lct),
            "lct.zst" | "zst" => Some(Kind::LctZstd),
            "jsonl" => Some(Kind::Jsonl),
            _ => None,
        }
    }
}

#[derive(Clone, Copy, Debug)]
pub struct ConvertOptions {
    pub to: Kind,
    /// Rewrite schema-2 and early shapes into schema 1.
    pub to_schema_1: bool,
    pub zstd_level: i32,
    pub read: ReadOptions,
}

/// What a conversion did.
#[derive(Clone, Debug, Default)]
pub struct ConvertReport {
    pub frames: u64,
    /// A signal stopped the conversion: the output holds the frames before it.
    pub interrupted: bool,
    /// Frames kept as raw bytes because they are not valid msgpack.
    pub raw_frames: u64,
    /// Bytes of a truncated tail carried over.
    pub tail_bytes: u64,
    pub migration: Option<Migration>,
}

/// One unit of a trace on its way through a conversion.
enum Item {
    Frame(Value),
    RawFrame(Vec<u8>),
    Tail(Vec<u8>),
}

/// The destination: a file (fsynced when finished) or standard output.
enum Output {
    File(TraceSink),
    Stream(Box<dyn Write>),
}

impl Write for Output {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Output::File(s) => s.write(buf),
            Output::Stream(s) => s.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            Output::File(s) => s.flush(),
            Output::Stream(s) => s.flush(),
        }
    }
}

impl Output {
    fn finish(self) -> io::Result<()> {
        match self {
            Output::File(s) => s.finish(),
            Output::Stream(mut s) => s.flush(),
        }
    }
}

/// Where converted items go, in which form.
struct Sink {
    jsonl: bool,
    out: Output,
}

/// Writes an item in the output's form: a frame, or a lossless JSON line.
fn put(out: &mut impl Write, jsonl: bool, item: &Item) -> io::Result<()> {
    if !jsonl {
        return match item {
            Item::Frame(v) => {
                let mut body = Vec::new();
                encode(v, &mut body);
                write_frame(out, &body)
            }
            Item::RawFrame(body) => write_frame(out, body),
            Item::Tail(bytes) => out.write_all(bytes),
        };
    }
    match item {
        Item::Frame(v) => serde_json::to_writer(&mut *out, &Lossless(v))?,
        Item::RawFrame(body) => serde_json::to_writer(
            &mut *out,
            &serde_json::json!({ "$frame_hex": hex::encode(body) }),
        )?,
        Item::Tail(bytes) => serde_json::to_writer(
            &mut *out,
            &serde_json::json!({ "$tail_hex": hex::encode(bytes) }),
        )?,
    }
    out.write_all(b"\n")
}

/// Applies the schema-1 rewrite to a header or record frame.
fn migrate_frame(frame: &mut Value, is_header: bool, migration: &mut Migration) {
    if is_header {
        if let Some(map) = frame.as_map_mut() {
            for (k, v) in map.iter_mut() {
                if matches!(k.as_str(), Some("trace_schema_version" | "lmcache_version")) {
                    *k = Value::str("trace_schema_version");
                    *v = Value::int(1);
                }
            }
        }
        return;
    }
    let qualname = frame
        .get("qualname")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_owned();
    if let Some(args) = frame.get_mut("args") {
        migration.migrate_args(&qualname, args);
    }
}

struct Pipeline<'a> {
    sink: Sink,
    progress: Progress<'a>,
    needs_values: bool,
    migration: Option<Migration>,
    report: ConvertReport,
    seen_header: bool,
    /// The output's name, for write errors (the caller names the input for read errors).
    shown_out: String,
}

/// A frame's body as the output needs it: a value tree when it is re-encoded (JSONL, or a
/// schema rewrite, which `migration` records), else the bytes as they are.
fn prepare(
    body: &[u8],
    needs_values: bool,
    is_header: bool,
    migration: Option<&mut Migration>,
) -> Item {
    let item = match needs_values.then(|| RawValue::parse(body)) {
        Some(Ok(v)) => Item::Frame(v.to_value()),
        _ => Item::RawFrame(body.to_vec()),
    };
    match (item, migration) {
        (Item::Frame(mut v), Some(m)) => {
            migrate_frame(&mut v, is_header, m);
            Item::Frame(v)
        }
        (other, _) => other,
    }
}

impl Pipeline<'_> {
    fn push(&mut self, item: Item) -> Result<()> {
        match item {
            Item::RawFrame(body) => self.push_bytes(&body),
            other => self.put(&other),
        }
    }

    /// A frame's bytes: written as they are, or as the value the output needs.
    fn push_bytes(&mut self, body: &[u8]) -> Result<()> {
        if self.needs_values {
            let item = prepare(body, true, !self.seen_header, self.migration.as_mut());
            return self.put(&item);
        }
        self.count_frame();
        self.seen_header = true;
        write_frame(&mut self.sink.out, body)
            .map_err(|e| Error::io("cannot write", e).in_file(&self.shown_out))
    }

    fn count_frame(&mut self) {
        self.report.frames += 1;
        if self.report.frames.is_multiple_of(PROGRESS_EVERY) {
            (self.progress)(self.report.frames, 0);
        }
    }

    fn put(&mut self, item: &Item) -> Result<()> {
        match item {
            Item::Frame(_) | Item::RawFrame(_) => self.count_frame(),
            Item::Tail(b) => self.report.tail_bytes += b.len() as u64,
        }
        self.seen_header = true;
        put(&mut self.sink.out, self.sink.jsonl, item)
            .map_err(|e| Error::io("cannot write", e).in_file(&self.shown_out))
    }
}

/// One block of converted frames, in the output's form.
#[derive(Default)]
struct Converted {
    out: Vec<u8>,
    frames: u64,
    raw_frames: u64,
    migration: Option<Migration>,
}

fn open_input(path: &Path) -> Result<Box<dyn Read + Send>> {
    if path.as_os_str() == "-" {
        return Ok(Box::new(io::stdin()));
    }
    let file = File::open(path).map_err(|e| Error::io("cannot open", e))?;
    Ok(Box::new(file))
}

fn open_output(path: &Path, kind: Kind, level: i32) -> Result<Sink> {
    let out = if path.as_os_str() == "-" {
        let stdout = BufWriter::new(io::stdout());
        Output::Stream(if kind == Kind::LctZstd {
            let z = zstd_encoder(stdout, level).map_err(|e| Error::io("cannot start zstd", e))?;
            Box::new(z.auto_finish())
        } else {
            Box::new(stdout)
        })
    } else {
        Output::File(TraceSink::create(
            path,
            (kind == Kind::LctZstd).then_some(level),
        )?)
    };
    Ok(Sink {
        jsonl: kind == Kind::Jsonl,
        out,
    })
}

/// Converts `input` to `output`. The output is flushed and fsynced even when the input turns
/// out to be bad half-way, so everything converted before the error is kept.
pub fn convert(
    input: &Path,
    output: &Path,
    options: ConvertOptions,
    progress: Progress<'_>,
) -> Result<ConvertReport> {
    let shown_in = input.display().to_string();
    let shown_out = output.display().to_string();
    crate::output::refuse_overwrite(input, output)?;
    let mut source = BufReader::new(open_input(input).map_err(|e| e.in_file(&shown_in))?);
    let first = source
        .fill_buf()
        .map_err(|e| Error::io("cannot read", e).in_file(&shown_in))?;
    let input_is_jsonl =
        first.first().is_some_and(|b| *b == b'{') && !first.starts_with(&ZSTD_MAGIC);
    let sink =
        open_output(output, options.to, options.zstd_level).map_err(|e| e.in_file(&shown_out))?;
    let mut pipeline = Pipeline {
        progress,
        needs_values: options.to == Kind::Jsonl || options.to_schema_1,
        sink,
        migration: options.to_schema_1.then(Migration::default),
        report: ConvertReport::default(),
        seen_header: false,
        shown_out: shown_out.clone(),
    };
    let result = if input_is_jsonl {
        let threads = options.read.threads();
        read_jsonl(source, threads, options.read.max_frame_bytes, &mut pipeline)
            .map_err(|e| e.in_file(&shown_in))
    } else {
        read_lct(source, options.read, &mut pipeline).map_err(|e| e.in_file(&shown_in))
    };
    let finished = pipeline
        .sink
        .out
        .finish()
        .map_err(|e| Error::io("cannot flush and fsync", e).in_file(&shown_out));
    let mut report = pipeline.report;
    report.migration = pipeline.migration;
    result?;
    finished?;
    Ok(report)
}

/// Reads LMCT: the frames after the header are converted a block per thread on every core
/// (turning msgpack into JSON costs far more than reading it) and written in stream order.
fn read_lct(
    source: impl Read + Send + 'static,
    read: ReadOptions,
    p: &mut Pipeline<'_>,
) -> Result<()> {
    let reader = TraceReader::from_reader(source, read)?;
    p.push(Item::RawFrame(reader.header_body().to_vec()))?;
    let (jsonl, needs_values, migrating) = (p.sink.jsonl, p.needs_values, p.migration.is_some());
    let mut write_error = None;
    // The blocks' texts, once written, are taken again by the next blocks.
    let spares = Spares::<Vec<u8>>::default();
    let summary = fold_frames(
        reader,
        read.threads(),
        BLOCK_BYTES,
        &|| Converted {
            migration: migrating.then(Migration::default),
            out: spares.take().unwrap_or_default(),
            ..Converted::default()
        },
        &|block, _, frame| {
            let body = match frame {
                Frame::Record(r) => r.body,
                Frame::Undecodable { body, .. } => {
                    block.raw_frames += 1;
                    body
                }
            };
            block.frames += 1;
            // A frame that needs no rewrite is written as lossless JSON from its bytes.
            if let (true, false, Frame::Record(r)) = (jsonl, migrating, frame) {
                if let Some(v) = RawLossless::record(r) {
                    v.write_compact(&mut block.out);
                    block.out.push(b'\n');
                    return;
                }
            }
            let item = prepare(body, needs_values, false, block.migration.as_mut());
            let _ = put(&mut block.out, jsonl, &item);
        },
        &mut |mut block| {
            let written = p.sink.out.write_all(&block.out);
            block.out.clear();
            spares.give(std::mem::take(&mut block.out));
            if let Err(e) = written {
                write_error = Some(e);
                return false;
            }
            p.report.frames += block.frames;
            p.report.raw_frames += block.raw_frames;
            if let (Some(all), Some(more)) = (p.migration.as_mut(), block.migration) {
                all.merge(&more);
            }
            (p.progress)(p.report.frames, 0);
            true
        },
        &|_, _| {},
    )?;
    if let Some(e) = write_error {
        return Err(Error::io("cannot write", e).in_file(&p.shown_out));
    }
    if crate::interrupt::requested().is_some() {
        p.report.interrupted = true;
        return Ok(());
    }
    if let Some(t) = summary.truncation {
        p.push(Item::Tail(t.bytes))?;
    }
    Ok(())
}

fn hex_field(obj: &serde_json::Map<String, Json>, key: &str, line: u64) -> Result<Vec<u8>> {
    let text = obj[key]
        .as_str()
        .ok_or_else(|| Error::line(line, key, "expected a hex string"))?;
    hex::decode(text).map_err(|e| Error::line(line, key, e.to_string()))
}

/// The deepest JSON nesting a line may have: lossless JSON wraps each msgpack level in at
/// most four (a form annotation, a `$map` annotation, its pair list, a pair), and a frame
/// nests at most [`MAX_DEPTH`] levels. The direct encoder stops there, and the check runs
/// before the trees' parse, so the parser's own recursion (and the stack) stays bounded
/// without serde_json's fixed 128-level limit, which would refuse lines `convert` itself
/// wrote.
const MAX_JSON_DEPTH: usize = 4 * (MAX_DEPTH + 1) + 2;

/// The maximum nesting of brackets and braces outside strings.
fn json_depth(line: &str) -> usize {
    let (mut depth, mut deepest, mut in_string, mut escaped) = (0usize, 0, false, false);
    for b in line.bytes() {
        match (in_string, escaped, b) {
            (true, true, _) => escaped = false,
            (true, false, b'\\') => escaped = true,
            (true, false, b'"') => in_string = false,
            (true, false, _) => {}
            (false, _, b'"') => in_string = true,
            (false, _, b'[' | b'{') => {
                depth += 1;
                deepest = deepest.max(depth);
            }
            (false, _, b']' | b'}') => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    deepest
}

/// A frame body a reader will accept: at most `max_frame_bytes` long and, unless it is kept
/// raw on purpose, msgpack no deeper than [`MAX_DEPTH`].
fn check_frame(body: &[u8], max_frame_bytes: u32, raw: bool, line: u64) -> Result<()> {
    if body.len() as u64 > u64::from(max_frame_bytes) {
        return Err(Error::line(
            line,
            "frame",
            format!(
                "{} bytes is over the {max_frame_bytes}-byte frame limit readers enforce",
                body.len()
            ),
        ));
    }
    if !raw {
        crate::lmct::msgpack::validate(body, 0)
            .map_err(|e| Error::line(line, "value", e.to_string()))?;
    }
    Ok(())
}

/// Bytes of lines each parsing thread takes at a time.
const CHUNK_BYTES: usize = 1 << 20;

/// A line may be this many times the frame limit long. Lossless JSON spends at most about 12.3
/// bytes on a frame's byte (its costliest form: an empty bin in a wider form is three bytes
/// and `{"$enc":"bin16","v":{"$bin_hex":""}},` 37; a small int in a wider form 11, a string
/// of control characters 6), so no frame a reader takes is refused; the rest is for
/// whitespace a hand-edited line may hold. A longer line ends the read when it passes the
/// limit, so memory stays bounded without a newline.
const LINE_BYTES_PER_FRAME_BYTE: usize = 16;

/// What a non-blank line of lossless JSON holds.
#[derive(Clone, Copy)]
enum Line {
    /// A frame's value.
    Frame,
    /// A `$frame_hex` line: bytes kept as they were.
    Raw,
    /// A `$tail_hex` line.
    Tail,
}

/// A chunk's lines, read: each line's number, kind and bytes (within `bytes`, where they
/// lie one after the other: one buffer a chunk, where one a line, allocated on a parsing
/// thread and freed on the writing one, made glibc's allocator take a lock for each), and
/// the error of the first line that could not be read, after the lines before it.
struct ParsedChunk {
    bytes: Vec<u8>,
    lines: Vec<(u64, Line, std::ops::Range<usize>)>,
    error: Option<Error>,
}

/// The lines of a source in chunks of about [`CHUNK_BYTES`] that end at a line's end, each
/// with the number of its first line.
struct Chunks<'s, R> {
    source: R,
    next_line: u64,
    /// The start of a line the last chunk cut.
    carry: Vec<u8>,
    /// Chunks parsed, to be filled again: a fresh megabyte each time was faulted in, cleared
    /// and unmapped by the kernel.
    spares: &'s Spares<Vec<u8>>,
    /// The longest line read (see [`LINE_BYTES_PER_FRAME_BYTE`]).
    max_line: usize,
    /// A line found too long, reported once the lines before it are handed over.
    too_long: Option<Error>,
}

impl<R: BufRead> Chunks<'_, R> {
    /// The next chunk; `None` at the end of the source.
    fn next(&mut self) -> Result<Option<(u64, Vec<u8>)>> {
        if let Some(e) = self.too_long.take() {
            return Err(e);
        }
        let mut chunk = self.spares.take().unwrap_or_default();
        chunk.clear();
        chunk.append(&mut self.carry);
        let mut cut = None;
        // Where the last line read starts (the carry is the start of one).
        let mut line_start = 0;
        loop {
            let from = chunk.len();
            // Straight into the chunk, a quarter of one at a time, not through the
            // reader's 8 KiB buffer.
            let n = (&mut self.source)
                .take(CHUNK_BYTES as u64 / 4)
                .read_to_end(&mut chunk)
                .map_err(|e| Error::io(format!("cannot read line {}", self.next_line + 1), e))?;
            if n == 0 {
                break;
            }
            if let Some(i) = memchr::memrchr(b'\n', &chunk[from..]) {
                line_start = from + i + 1;
                // The chunk ends after its last whole line; a longer line reads on.
                if chunk.len() >= CHUNK_BYTES {
                    cut = Some(line_start);
                    break;
                }
            }
            if chunk.len() - line_start > self.max_line {
                let line = self.next_line
                    + 1
                    + memchr::memchr_iter(b'\n', &chunk[..line_start]).count() as u64;
                let e = Error::line(
                    line,
                    "frame",
                    format!(
                        "a line over {} bytes: lossless JSON writes no frame within the \
                         {}-byte frame limit readers enforce that long",
                        self.max_line,
                        self.max_line / LINE_BYTES_PER_FRAME_BYTE
                    ),
                );
                if line_start == 0 {
                    return Err(e);
                }
                // The whole lines before it are read first, as a bad line's are.
                self.too_long = Some(e);
                chunk.truncate(line_start);
                break;
            }
        }
        if chunk.is_empty() {
            return Ok(None);
        }
        if let Some(cut) = cut {
            self.carry = chunk.split_off(cut);
        }
        let first = self.next_line + 1;
        self.next_line += memchr::memchr_iter(b'\n', &chunk).count() as u64;
        Ok(Some((first, chunk)))
    }
}

/// Reads the lines of `chunk`, the first numbered `first`, up to the first that fails.
fn parse_chunk(chunk: &[u8], first: u64, max_frame_bytes: u32) -> ParsedChunk {
    let mut parsed = ParsedChunk {
        bytes: Vec::with_capacity(chunk.len()),
        lines: Vec::new(),
        error: None,
    };
    let mut text = chunk.strip_suffix(b"\n").unwrap_or(chunk);
    let mut line_no = first;
    loop {
        let (line, rest) = match memchr::memchr(b'\n', text) {
            Some(i) => (&text[..i], Some(&text[i + 1..])),
            None => (text, None),
        };
        let start = parsed.bytes.len();
        match parse_line(line, line_no, max_frame_bytes, &mut parsed.bytes) {
            Ok(Some(read)) => {
                let end = parsed.bytes.len();
                parsed.lines.push((line_no, read, start..end));
            }
            Ok(None) => {}
            Err(e) => {
                parsed.error = Some(e);
                return parsed;
            }
        }
        let Some(rest) = rest else {
            return parsed;
        };
        text = rest;
        line_no += 1;
    }
}

/// One line, its bytes appended to `out`: `None` when it is blank.
fn parse_line(
    line: &[u8],
    line_no: u64,
    max_frame_bytes: u32,
    out: &mut Vec<u8>,
) -> Result<Option<Line>> {
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let line = std::str::from_utf8(line).map_err(|_| {
        let e = io::Error::new(
            io::ErrorKind::InvalidData,
            "stream did not contain valid UTF-8",
        );
        Error::io(format!("cannot read line {line_no}"), e)
    })?;
    if line.trim().is_empty() {
        return Ok(None);
    }
    // A frame's line, the bulk of a file, straight into msgpack; `$frame_hex` and
    // `$tail_hex` lines, and anything the direct path leaves, through the trees.
    let start = out.len();
    if !line.contains("$frame_hex")
        && !line.contains("$tail_hex")
        && encode_lossless(line, MAX_JSON_DEPTH, out).is_some()
    {
        check_frame(&out[start..], max_frame_bytes, false, line_no)?;
        return Ok(Some(Line::Frame));
    }
    let depth = json_depth(line);
    if depth > MAX_JSON_DEPTH {
        return Err(Error::line(
            line_no,
            "json",
            format!("nested {depth} levels deep, over the {MAX_JSON_DEPTH} a frame can need"),
        ));
    }
    let mut parser = serde_json::Deserializer::from_str(line);
    parser.disable_recursion_limit();
    let json = Json::deserialize(&mut parser)
        .and_then(|j| parser.end().map(|()| j))
        .map_err(|e| Error::line(line_no, "json", e.to_string()))?;
    Ok(Some(match json.as_object() {
        Some(obj) if obj.contains_key("$frame_hex") => {
            out.extend(hex_field(obj, "$frame_hex", line_no)?);
            check_frame(&out[start..], max_frame_bytes, true, line_no)?;
            Line::Raw
        }
        Some(obj) if obj.contains_key("$tail_hex") => {
            out.extend(hex_field(obj, "$tail_hex", line_no)?);
            Line::Tail
        }
        _ => {
            let value = from_lossless(&json).map_err(|e| Error::line(line_no, "value", e))?;
            encode(&value, out);
            check_frame(&out[start..], max_frame_bytes, false, line_no)?;
            Line::Frame
        }
    }))
}

/// Reads lossless JSON: chunks of lines are read in order, parsed on `threads` threads
/// (parsing a line costs far more than writing its frame) and pushed in order, so an error
/// names its line after every frame before it was written. A chunk is read only when one of
/// the few in flight has been pushed, which bounds the memory; once the pushing stops (an
/// error, an interrupt) no chunk is read or parsed again, so that the error comes as soon
/// as its line is read, whatever the pace of the source.
fn read_jsonl(
    source: impl BufRead + Send,
    threads: usize,
    max_frame_bytes: u32,
    p: &mut Pipeline<'_>,
) -> Result<()> {
    let threads = threads.max(1);
    let (work_tx, work_rx) = crossbeam_channel::bounded::<(u64, u64, Vec<u8>)>(threads);
    let (done_tx, done_rx) = mpsc::channel::<(u64, ParsedChunk)>();
    let (slot_tx, slot_rx) = mpsc::channel::<()>();
    for _ in 0..3 * threads + 1 {
        let _ = slot_tx.send(());
    }
    let spares = Spares::default();
    let stopping = AtomicBool::new(false);
    let mut chunks = Chunks {
        source,
        next_line: 0,
        carry: Vec::new(),
        spares: &spares,
        max_line: (max_frame_bytes as usize).saturating_mul(LINE_BYTES_PER_FRAME_BYTE),
        too_long: None,
    };
    std::thread::scope(|scope| {
        for _ in 0..threads {
            let (work_rx, done_tx, spares) = (work_rx.clone(), done_tx.clone(), &spares);
            let stopping = &stopping;
            scope.spawn(move || {
                for (seq, first, chunk) in work_rx {
                    if stopping.load(Ordering::Relaxed) {
                        return;
                    }
                    let parsed = parse_chunk(&chunk, first, max_frame_bytes);
                    spares.give(chunk);
                    if done_tx.send((seq, parsed)).is_err() {
                        return;
                    }
                }
            });
        }
        drop((work_rx, done_tx));
        let stopping = &stopping;
        let reading = scope.spawn(move || -> Result<()> {
            for seq in 0.. {
                if slot_rx.recv().is_err() || stopping.load(Ordering::Relaxed) {
                    return Ok(());
                }
                let Some((first, chunk)) = chunks.next()? else {
                    return Ok(());
                };
                if work_tx.send((seq, first, chunk)).is_err() {
                    return Ok(());
                }
            }
            Ok(())
        });
        let pushed = (|| -> Result<()> {
            let mut pending = BTreeMap::new();
            let mut next = 0;
            for (seq, chunk) in done_rx.iter() {
                pending.insert(seq, chunk);
                while let Some(chunk) = pending.remove(&next) {
                    next += 1;
                    if crate::interrupt::requested().is_some() {
                        p.report.interrupted = true;
                        return Ok(());
                    }
                    for (line_no, line, bytes) in chunk.lines {
                        push_line(p, line_no, line, &chunk.bytes[bytes])?;
                    }
                    if let Some(e) = chunk.error {
                        return Err(e);
                    }
                    let _ = slot_tx.send(());
                }
            }
            Ok(())
        })();
        // Whatever ended the pushing, the reading thread takes no more slots and the workers
        // parse nothing more: a chunk they hold, or one the reading thread is reading, is the
        // last.
        stopping.store(true, Ordering::Relaxed);
        drop(slot_tx);
        pushed?;
        reading
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic))?;
        if p.report.interrupted {
            return Ok(());
        }
        if !p.seen_header {
            return Err(Error::line(1, "header", "no header line: empty input"));
        }
        Ok(())
    })
}

/// Pushes one line read, its bytes `bytes`; the first must be the header.
fn push_line(p: &mut Pipeline<'_>, line_no: u64, line: Line, bytes: &[u8]) -> Result<()> {
    if !p.seen_header {
        let Line::Frame = line else {
            return Err(Error::line(
                line_no,
                "header",
                "the first line must be the header",
            ));
        };
        Header::parse(bytes).map_err(|(field, msg)| Error::line(line_no, field, msg))?;
    }
    match line {
        Line::Frame => p.push_bytes(bytes),
        Line::Raw => {
            p.report.raw_frames += 1;
            p.push_bytes(bytes)
        }
        Line::Tail => p.push(Item::Tail(bytes.to_vec())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::synth::{write_to, SynthOptions};
    use crate::QUIET;

    /// A conversion to `to` with `read`, no schema rewrite, zstd at its default level.
    fn converting(to: Kind, read: ReadOptions) -> ConvertOptions {
        ConvertOptions {
            to,
            to_schema_1: false,
            zstd_level: 3,
            read,
        }
    }

    /// Blocks converted on several threads land in stream order: a trace of several blocks,
    /// with an undecodable frame and a cut tail, goes to JSONL identically on 1 and 3
    /// threads and comes back byte for byte.
    #[test]
    fn a_multi_block_trace_converts_the_same_on_any_thread_count() {
        let dir = tempfile::tempdir().expect("tmp");
        let options = SynthOptions {
            records: 6000,
            ..SynthOptions::default()
        };
        let mut bytes = write_to(&options, Vec::new(), QUIET).expect("trace");
        assert!(bytes.len() > 3 * BLOCK_BYTES, "{} bytes", bytes.len());
        let middle = {
            let mut r =
                TraceReader::from_reader(io::Cursor::new(bytes.clone()), ReadOptions::default())
                    .expect("header");
            let mut offset = 0;
            while let Some(record) = r.next_record().expect("read") {
                offset = record.offset as usize;
                if offset > bytes.len() / 2 {
                    break;
                }
            }
            offset
        };
        bytes[middle + 4..middle + 12].fill(0xc1);
        bytes.truncate(bytes.len() - 5);
        let original = dir.path().join("t.lct");
        std::fs::write(&original, &bytes).expect("write");
        let run = |input: &Path, output: &Path, to: Kind, threads: usize| {
            let read = ReadOptions {
                threads,
                ..ReadOptions::default()
            };
            convert(input, output, converting(to, read), QUIET).expect("convert")
        };
        let (one, three) = (dir.path().join("1.jsonl"), dir.path().join("3.jsonl"));
        let report = run(&original, &one, Kind::Jsonl, 1);
        run(&original, &three, Kind::Jsonl, 3);
        assert_eq!(std::fs::read(&one).unwrap(), std::fs::read(&three).unwrap());
        assert_eq!((report.raw_frames, report.tail_bytes > 0), (1, true));
        for threads in [1, 3] {
            let back = dir.path().join(format!("back{threads}.lct"));
            run(&three, &back, Kind::Lct, threads);
            assert_eq!(std::fs::read(&back).unwrap(), bytes);
            let again = dir.path().join(format!("again{threads}.jsonl"));
            run(&three, &again, Kind::Jsonl, threads);
            assert_eq!(std::fs::read(&again).unwrap(), std::fs::read(&one).unwrap());
        }
        // A bad line in a late chunk: the error names it, and every frame before it is
        // written, as converting the lines before it alone writes them.
        let text = std::fs::read_to_string(&three).unwrap();
        let mut lines: Vec<&str> = text.lines().collect();
        assert!(text.len() > 3 * CHUNK_BYTES, "{} bytes", text.len());
        let bad = lines.len() * 4 / 5;
        lines[bad] = "{\"type\": nope}";
        let (broken, prefix) = (dir.path().join("bad.jsonl"), dir.path().join("pre.jsonl"));
        std::fs::write(&broken, lines.join("\n") + "\n").unwrap();
        std::fs::write(&prefix, lines[..bad].join("\n") + "\n").unwrap();
        let (cut, whole) = (dir.path().join("cut.lct"), dir.path().join("pre.lct"));
        let read = ReadOptions {
            threads: 3,
            ..ReadOptions::default()
        };
        let error =
            convert(&broken, &cut, converting(Kind::Lct, read), QUIET).expect_err("a bad line");
        assert!(
            error.to_string().contains(&format!("line {}", bad + 1)),
            "{error}"
        );
        run(&prefix, &whole, Kind::Lct, 1);
        assert_eq!(std::fs::read(&cut).unwrap(), std::fs::read(&whole).unwrap());
    }

    /// A line longer than its limit several chunks in: the error counts the lines of every
    /// chunk before it, and the frames before it are written.
    #[test]
    fn a_line_over_its_limit_is_named_after_the_frames_before_it() {
        let dir = tempfile::tempdir().expect("tmp");
        let options = SynthOptions {
            records: 6000,
            ..SynthOptions::default()
        };
        let lct = dir.path().join("t.lct");
        std::fs::write(&lct, write_to(&options, Vec::new(), QUIET).expect("trace")).unwrap();
        let read = ReadOptions {
            max_frame_bytes: 1 << 16,
            ..ReadOptions::default()
        };
        let jsonl = dir.path().join("t.jsonl");
        convert(&lct, &jsonl, converting(Kind::Jsonl, read), QUIET).expect("to jsonl");
        let mut text = std::fs::read_to_string(&jsonl).unwrap();
        let lines = text.lines().count();
        assert!(text.len() > 3 * CHUNK_BYTES, "{} bytes", text.len());
        text += &format!("{{\"a\":\"{}\"}}\n", "a".repeat(2 << 20));
        let long = dir.path().join("long.jsonl");
        std::fs::write(&long, text).unwrap();
        let cut = dir.path().join("cut.lct");
        let error = convert(&long, &cut, converting(Kind::Lct, read), QUIET).expect_err("too long");
        assert!(
            error.to_string().contains(&format!(
                "line {}: frame: a line over 1048576 bytes",
                lines + 1
            )),
            "{error}"
        );
        assert_eq!(std::fs::read(&cut).unwrap(), std::fs::read(&lct).unwrap());
    }

    /// Lines served quickly for a first chunk and slowly after it (a network pipe), counting
    /// the bytes taken.
    struct SlowAfterFirstChunk {
        text: Vec<u8>,
        at: usize,
        taken: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    }

    impl Read for SlowAfterFirstChunk {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            if self.at >= CHUNK_BYTES {
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            let n = buf.len().min(64 << 10).min(self.text.len() - self.at);
            buf[..n].copy_from_slice(&self.text[self.at..self.at + n]);
            self.at += n;
            self.taken.store(self.at, Ordering::Relaxed);
            Ok(n)
        }
    }

    /// Once a line fails, the reading stops with the chunk being read: from a slow source
    /// the error comes after its own chunk, not after every chunk the reading thread could
    /// still take a slot for (3 × 2 + 1 on two threads, which it read before).
    #[test]
    fn a_bad_line_stops_the_reading_of_a_slow_source() {
        let mut text = b"{\"type\": nope}\n".to_vec();
        while text.len() < 16 * CHUNK_BYTES {
            text.extend_from_slice(b"{\"type\": \"record\"}\n");
        }
        let taken = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let source = BufReader::new(SlowAfterFirstChunk {
            text,
            at: 0,
            taken: taken.clone(),
        });
        let dir = tempfile::tempdir().expect("tmp");
        let mut p = Pipeline {
            sink: open_output(&dir.path().join("out.lct"), Kind::Lct, 3).expect("sink"),
            progress: QUIET,
            needs_values: false,
            migration: None,
            report: ConvertReport::default(),
            seen_header: false,
            shown_out: String::new(),
        };
        let error = read_jsonl(source, 2, u32::MAX, &mut p).expect_err("a bad first line");
        assert!(error.to_string().contains("line 1"), "{error}");
        // The first chunk, and the one being read when its error was found (each slow
        // chunk takes 160 ms, the first's parse well under one); the margin of two more is
        // for a busy machine.
        let taken = taken.load(Ordering::Relaxed);
        assert!(taken <= 4 * CHUNK_BYTES, "{taken} bytes read");
    }
}
