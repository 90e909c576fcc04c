//! `kvtrace dump`: every frame as display JSON (codec tags decoded, bin as hex), the header
//! first. Turning msgpack into JSON text costs far more than reading it, so a whole dump is
//! formatted on every core, a block of frames per thread, and written in stream order; a
//! dump with `--limit` reads only as far as it prints.

use std::io::{self, Write};

use serde::ser::{Serialize, SerializeMap, Serializer};
use serde_json::{json, Map, Value as Json};

use super::Progress;
use crate::error::{Error, Result};
use crate::lmct::blocks::{fold_frames, Spares};
use crate::lmct::display::{to_display, write_int, write_pretty, write_str, Shown};
use crate::lmct::msgpack::RawValue;
use crate::lmct::{Frame, ReadOptions, ReadSummary, RecordRef, TraceReader};

/// Bytes of frames each formatting thread takes at a time.
const BLOCK_BYTES: usize = 1 << 20;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// One JSON object per line.
    Jsonl,
    /// One pretty-printed JSON array.
    Json,
}

/// Which records a dump shows, by qualname: a glob (`*`, `?`, `[..]`) matched against the
/// whole name, or a plain substring when the pattern has no wildcard.
pub enum Filter {
    All,
    Glob(glob::Pattern),
    Substring(String),
}

impl Filter {
    pub fn new(pattern: Option<&str>) -> Result<Filter> {
        Ok(match pattern {
            None => Filter::All,
            Some(p) if p.contains(['*', '?', '[']) => Filter::Glob(
                glob::Pattern::new(p)
                    .map_err(|e| Error::usage(format!("{p:?}: not a glob pattern: {e}")))?,
            ),
            Some(p) => Filter::Substring(p.to_owned()),
        })
    }

    fn matches(&self, qualname: &str) -> bool {
        match self {
            Filter::All => true,
            Filter::Glob(g) => g.matches(qualname),
            Filter::Substring(s) => qualname.contains(s.as_str()),
        }
    }
}

pub struct DumpOptions {
    pub format: Format,
    /// Print at most this many records (the header is not counted).
    pub limit: Option<u64>,
    pub filter: Filter,
    pub header: bool,
    /// Formatting threads; 0: one per core.
    pub threads: usize,
}

/// How a dump ended.
#[derive(Debug)]
pub enum Ended {
    Complete(ReadSummary),
    /// The output was closed (`kvtrace dump | head`) and the caller chose to stop quietly.
    OutputClosed,
}

fn frame_object(index: u64, offset: u64, len: usize, body: Json) -> Json {
    let mut m = Map::new();
    m.insert("frame".into(), json!(index));
    m.insert("offset".into(), json!(offset));
    m.insert("len".into(), json!(len));
    if let Json::Object(fields) = body {
        m.extend(fields);
    }
    Json::Object(m)
}

/// A record's object: where its frame lies, then its fields. Serialized straight from the
/// frame, it is the text [`frame_object`] of the record's fields would give.
struct RecordObject<'a> {
    index: u64,
    record: &'a RecordRef<'a>,
}

impl Serialize for RecordObject<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        let r = self.record;
        let mut m = s.serialize_map(Some(8))?;
        m.serialize_entry("frame", &self.index)?;
        m.serialize_entry("offset", &r.offset)?;
        m.serialize_entry("len", &r.body.len())?;
        m.serialize_entry("type", "record")?;
        // A non-finite time is shown as null, as JSON has no such number.
        m.serialize_entry("t_mono", &Json::from(r.t_mono))?;
        m.serialize_entry("t_wall", &Json::from(r.t_wall))?;
        m.serialize_entry("qualname", r.qualname)?;
        m.serialize_entry("args", &Shown::args(r))?;
        m.end()
    }
}

impl RecordObject<'_> {
    /// The compact text of [`RecordObject`]'s serialization, written without serde (see
    /// [`Shown::write_compact`]).
    fn write_compact(&self, out: &mut Vec<u8>) {
        let r = self.record;
        out.extend_from_slice(b"{\"frame\":");
        write_int(out, self.index);
        out.extend_from_slice(b",\"offset\":");
        write_int(out, r.offset);
        out.extend_from_slice(b",\"len\":");
        write_int(out, r.body.len());
        out.extend_from_slice(b",\"type\":\"record\",\"t_mono\":");
        write_time(out, r.t_mono);
        out.extend_from_slice(b",\"t_wall\":");
        write_time(out, r.t_wall);
        out.extend_from_slice(b",\"qualname\":");
        write_str(out, r.qualname);
        out.extend_from_slice(b",\"args\":");
        Shown::args(r).write_compact(out);
        out.push(b'}');
    }
}

/// A time as [`RecordObject`] shows it: a number, or null when not finite.
fn write_time(out: &mut Vec<u8>, t: f64) {
    // Writing into a Vec cannot fail.
    let _ = serde_json::to_writer(&mut *out, &Json::from(t));
}

/// Appends the object a frame is shown as; `false` when the filter leaves its record out.
fn append_frame(
    out: &mut Vec<u8>,
    format: Format,
    index: u64,
    frame: &Frame<'_>,
    filter: &Filter,
) -> bool {
    match frame {
        Frame::Record(record) if filter.matches(record.qualname) => {
            let object = RecordObject { index, record };
            match format {
                Format::Jsonl => {
                    object.write_compact(out);
                    out.push(b'\n');
                }
                Format::Json => {
                    out.extend_from_slice(b",\n");
                    COMPACT.with_borrow_mut(|compact| {
                        compact.clear();
                        object.write_compact(compact);
                        write_pretty(compact, out);
                    });
                }
            }
        }
        Frame::Record(_) => return false,
        Frame::Undecodable {
            offset,
            body,
            reason,
        } => append(
            out,
            format,
            &frame_object(index, *offset, body.len(), json!({ "undecodable": reason })),
        ),
    }
    true
}

thread_local! {
    /// A record's compact text on its way to a pretty dump, kept from record to record.
    static COMPACT: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Appends one object: a line, or an array element after `,\n` (the writer turns the first
/// element's into `[\n`).
fn append(out: &mut Vec<u8>, format: Format, object: &impl Serialize) {
    // Serializing into a Vec cannot fail: every map key written is a string.
    match format {
        Format::Jsonl => {
            let _ = serde_json::to_writer(&mut *out, object);
            out.push(b'\n');
        }
        Format::Json => {
            out.extend_from_slice(b",\n");
            let _ = serde_json::to_writer_pretty(&mut *out, object);
        }
    }
}

/// Writes formatted objects in order and closes the array.
struct Writer<'w> {
    out: &'w mut dyn Write,
    format: Format,
    printed: u64,
}

impl Writer<'_> {
    fn write(&mut self, text: &[u8], objects: u64) -> io::Result<()> {
        if objects == 0 {
            return Ok(());
        }
        if self.format == Format::Json && self.printed == 0 {
            self.out.write_all(b"[\n")?;
            self.out.write_all(&text[2..])?;
        } else {
            self.out.write_all(text)?;
        }
        self.printed += objects;
        Ok(())
    }

    fn finish(self) -> io::Result<()> {
        if self.format == Format::Json {
            let end: &[u8] = if self.printed == 0 { b"[]\n" } else { b"\n]\n" };
            self.out.write_all(end)?;
        }
        self.out.flush()
    }
}

/// Dumps `reader` into `out`. A write error goes to `write_failed`, which turns it into the
/// error to return or, with `None`, ends the dump quietly.
pub fn dump(
    mut reader: TraceReader,
    options: &DumpOptions,
    out: &mut dyn Write,
    write_failed: &dyn Fn(io::Error) -> Option<Error>,
    progress: Progress<'_>,
) -> Result<Ended> {
    let mut writer = Writer {
        out,
        format: options.format,
        printed: 0,
    };
    let failed = |e: io::Error| write_failed(e).map_or(Ok(Ended::OutputClosed), Err);
    if options.header {
        let header = RawValue::parse(reader.header_body())
            .map(to_display)
            .unwrap_or(Json::Null);
        let mut text = Vec::new();
        append(
            &mut text,
            options.format,
            &frame_object(0, 0, reader.header_body().len(), header),
        );
        if let Err(e) = writer.write(&text, 1) {
            return failed(e);
        }
    }
    let summary = match options.limit {
        Some(limit) => {
            let mut index = 0;
            let mut text = Vec::new();
            let mut records = 0;
            while records < limit {
                let Some(frame) = reader.next_frame()? else {
                    break;
                };
                index += 1;
                text.clear();
                if !append_frame(&mut text, options.format, index, &frame, &options.filter) {
                    continue;
                }
                if let Err(e) = writer.write(&text, 1) {
                    return failed(e);
                }
                records += 1;
                if index.is_multiple_of(4096) {
                    progress(index, frame.offset());
                }
            }
            reader.into_summary()
        }
        None => {
            let mut write_error = None;
            let threads = ReadOptions {
                threads: options.threads,
                ..ReadOptions::default()
            }
            .threads();
            // The blocks' texts, once written, are taken again by the next blocks.
            let spares = Spares::<Vec<u8>>::default();
            let summary = fold_frames(
                reader,
                threads,
                BLOCK_BYTES,
                &|| (spares.take().unwrap_or_default(), 0u64),
                &|(text, objects), index, frame| {
                    if append_frame(text, options.format, index, frame, &options.filter) {
                        *objects += 1;
                    }
                },
                &mut |(mut text, objects)| {
                    let written = writer.write(&text, objects);
                    text.clear();
                    spares.give(text);
                    match written {
                        Ok(()) => true,
                        Err(e) => {
                            write_error = Some(e);
                            false
                        }
                    }
                },
                progress,
            )?;
            if let Some(e) = write_error {
                return failed(e);
            }
            summary
        }
    };
    match writer.finish() {
        Ok(()) => Ok(Ended::Complete(summary)),
        Err(e) => failed(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::synth::{write_to, SynthOptions};
    use crate::QUIET;

    fn reader(bytes: &[u8]) -> TraceReader {
        TraceReader::from_reader(io::Cursor::new(bytes.to_vec()), ReadOptions::default())
            .expect("header")
    }

    fn dumped(bytes: &[u8], options: &DumpOptions) -> Vec<u8> {
        let mut out = Vec::new();
        let ended = dump(
            reader(bytes),
            options,
            &mut out,
            &|e| Some(Error::io("w", e)),
            QUIET,
        );
        assert!(matches!(ended, Ok(Ended::Complete(_))), "{ended:?}");
        out
    }

    /// A trace with an undecodable frame and a cut tail.
    fn trace() -> Vec<u8> {
        let options = SynthOptions {
            records: 400,
            ..SynthOptions::default()
        };
        let mut bytes = write_to(&options, Vec::new(), QUIET).expect("trace");
        let mut r = reader(&bytes);
        let second = {
            r.next_frame().expect("read");
            r.next_frame().expect("read").expect("frame").offset() as usize
        };
        bytes[second + 4..second + 12].fill(0xc1);
        bytes.truncate(bytes.len() - 7);
        bytes
    }

    /// Formatting on several threads prints what printing frame by frame (the `--limit`
    /// path, with no effective limit) prints: the same frames, indexes, filter and array.
    #[test]
    fn a_dump_on_several_threads_equals_one_frame_at_a_time() {
        let bytes = trace();
        for format in [Format::Jsonl, Format::Json] {
            for pattern in [None, Some("*finish_write"), Some("no such call")] {
                let options = |threads, limit| DumpOptions {
                    format,
                    limit,
                    filter: Filter::new(pattern).expect("pattern"),
                    header: pattern.is_none(),
                    threads,
                };
                let expected = dumped(&bytes, &options(1, Some(u64::MAX)));
                for threads in [1, 3] {
                    assert_eq!(dumped(&bytes, &options(threads, None)), expected);
                }
                let text = String::from_utf8(expected).expect("utf-8");
                // An undecodable frame has no qualname to filter on: it is always shown.
                assert!(text.contains("undecodable"));
                assert_eq!(
                    text.contains("finish_write"),
                    pattern != Some("no such call")
                );
                if format == Format::Json {
                    serde_json::from_str::<Json>(&text).expect("one JSON array");
                }
            }
        }
    }

    /// A record's line is the compact text serde_json gives its object, and spaced it is
    /// the pretty text, for every record of a trace, and with times JSON has no number for
    /// and a qualname to escape.
    #[test]
    fn a_records_line_is_serde_jsons_text_of_its_object() {
        let bytes = trace();
        let mut r = reader(&bytes);
        let mut records = 0;
        while let Some(frame) = r.next_frame().expect("read") {
            let Frame::Record(record) = frame else {
                continue;
            };
            let mut odd = record;
            (odd.t_mono, odd.t_wall, odd.qualname) =
                (f64::NAN, f64::NEG_INFINITY, "a\"b\\\n\u{1}é");
            for (index, record) in [(records, record), (u64::MAX, odd)] {
                let object = RecordObject {
                    index,
                    record: &record,
                };
                let mut line = Vec::new();
                object.write_compact(&mut line);
                assert_eq!(line, serde_json::to_vec(&object).expect("text"));
                let mut pretty = Vec::new();
                write_pretty(&line, &mut pretty);
                assert_eq!(pretty, serde_json::to_vec_pretty(&object).expect("text"));
            }
            records += 1;
        }
        assert!(records > 300, "{records} records");
    }

    /// A closed output ends the dump where the caller says: quietly, or with its error.
    #[test]
    fn a_closed_output_stops_the_dump() {
        struct Closed;
        impl Write for Closed {
            fn write(&mut self, _: &[u8]) -> io::Result<usize> {
                Err(io::ErrorKind::BrokenPipe.into())
            }
            fn flush(&mut self) -> io::Result<()> {
                Ok(())
            }
        }
        let bytes = trace();
        for header in [true, false] {
            let options = DumpOptions {
                format: Format::Jsonl,
                limit: None,
                filter: Filter::All,
                header,
                threads: 2,
            };
            let quiet = dump(reader(&bytes), &options, &mut Closed, &|_| None, QUIET);
            assert!(matches!(quiet, Ok(Ended::OutputClosed)));
            let loud = dump(
                reader(&bytes),
                &options,
                &mut Closed,
                &|e| Some(Error::io("cannot write", e)),
                QUIET,
            );
            assert!(loud.is_err_and(|e| e.to_string().contains("cannot write")));
        }
    }
}
