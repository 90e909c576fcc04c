//! The Mooncake request-trace format (JSONL, one request per line): read whole into a
//! [`Workload`] for the simulation, or as bare hash ids for a trace's storage calls
//! (`kvtrace generate --from-mooncake`). Each line is bounded before it is parsed, and a bad
//! row names its line and field.

use std::collections::HashMap;
use std::io::BufRead;

use serde_json::Value as Json;

use crate::error::{Error, Result};
use crate::limits::{LineLimit, MAX_HASH_IDS_PER_ROW, MAX_LINE_BYTES};

/// The longest prompt a `mooncake-delta` session may grow to (a context no model serves).
pub const MAX_PROMPT_TOKENS: u32 = 1 << 30;
use crate::workload::{Prompt, Run, Session, Turn, Workload};

/// How the error for a row whose hash ids cover fewer tokens than its prompt ends: the
/// trace's block size is not the one the reader was given.
pub const GIVE_BLOCK_SIZE: &str = "give the trace's block size (tokens per hash id)";

/// Reads a Mooncake-style JSONL trace: every row holds its turn's whole prompt. Hash ids are
/// interned in first-seen order; the first arrival becomes time 0.
pub fn read_mooncake(src: impl BufRead + Send, trace_block_size: u32) -> Result<Workload> {
    read_sessions(src, trace_block_size, false)
}

/// Reads a `mooncake-delta` trace: the same rows, but a session's later rows hold only the
/// input the turn adds. Each turn's prompt is rebuilt as the session's previous prompt, that
/// turn's generated output (content no other request has) and the new input, as Dynamo's
/// loader accumulates them.
pub fn read_mooncake_delta(src: impl BufRead + Send, trace_block_size: u32) -> Result<Workload> {
    read_sessions(src, trace_block_size, true)
}

fn read_sessions(src: impl BufRead + Send, trace_block_size: u32, delta: bool) -> Result<Workload> {
    let mut ids = Interner::default();
    let mut sessions: Vec<Session> = Vec::new();
    let mut by_id: HashMap<String, (usize, f64)> = HashMap::new();
    let mut last_timestamp = 0.0f64;
    for_each_row(src, |number, row| {
        let turn = row.turn(number, trace_block_size, &mut ids)?;
        let timestamp = row.timestamp.unwrap_or(last_timestamp);
        last_timestamp = timestamp;
        match row.session_id {
            Some(id) => match by_id.get_mut(&id) {
                Some((at, previous)) => {
                    let delay = row.delay.unwrap_or((timestamp - *previous).max(0.0));
                    *previous = timestamp;
                    let session = &mut sessions[*at];
                    let prompt = if delta {
                        let last = session.turns.last_mut().expect("a session has a turn");
                        let output = Run {
                            id: ids.fresh(number)?,
                            tokens: last.output_length,
                        };
                        last.output_content = Some(output.id);
                        let mut runs = vec![output];
                        runs.extend_from_slice(&turn.prompt.runs);
                        let prompt = last.prompt.extended(&runs);
                        if prompt.len > MAX_PROMPT_TOKENS {
                            return Err(Error::line(
                                number,
                                "input_length",
                                format!(
                                    "the session's prompt grows past {MAX_PROMPT_TOKENS} tokens"
                                ),
                            ));
                        }
                        prompt
                    } else {
                        turn.prompt
                    };
                    session.turns.push(Turn {
                        prompt,
                        delay_ms: delay,
                        ..turn
                    });
                }
                None => {
                    if row.delay.is_some() {
                        return Err(Error::line(
                            number,
                            "delay",
                            "the first turn of a session cannot carry a delay",
                        ));
                    }
                    by_id.insert(id.clone(), (sessions.len(), timestamp));
                    sessions.push(Session {
                        id: Some(id),
                        start_ms: timestamp,
                        turns: vec![turn],
                    });
                }
            },
            None => sessions.push(Session {
                id: None,
                start_ms: timestamp,
                turns: vec![turn],
            }),
        }
        Ok(())
    })?;
    let origin = sessions
        .iter()
        .map(|s| s.start_ms)
        .fold(f64::INFINITY, f64::min);
    for s in &mut sessions {
        s.start_ms -= origin;
    }
    Ok(Workload {
        sessions,
        graph: None,
        planned_outputs: true,
    })
}

/// Content ids: a trace's hash ids in first-seen order, and fresh ones for generated output.
/// The map hashes with foldhash, seeded per process: with std's SipHash, interning took
/// a third of reading a Mooncake trace (about 500 instructions an id). The map is never
/// walked, so its order (the seed's) reaches no output.
#[derive(Default)]
pub(crate) struct Interner {
    map: foldhash::HashMap<u64, u32>,
    next: u32,
}

impl Interner {
    pub(crate) fn intern(&mut self, hash: u64, line: u64) -> Result<u32> {
        if let Some(&id) = self.map.get(&hash) {
            return Ok(id);
        }
        let id = self.fresh(line)?;
        self.map.insert(hash, id);
        Ok(id)
    }

    pub(crate) fn fresh(&mut self, line: u64) -> Result<u32> {
        // u32::MAX stands for content no prompt shares (Prompt::from_blocks).
        if self.next == u32::MAX {
            return Err(Error::line(
                line,
                "hash_ids",
                "more distinct contents than 2^32 - 1",
            ));
        }
        self.next += 1;
        Ok(self.next - 1)
    }
}

/// Reads only the hash ids of a Mooncake-style JSONL trace's rows, in file order, each row
/// checked as [`read_mooncake`] checks it.
pub fn read_mooncake_hash_ids(src: impl BufRead + Send) -> Result<Vec<Vec<u64>>> {
    let mut requests = Vec::new();
    for_each_row(src, |_, row| {
        requests.push(row.hash_ids);
        Ok(())
    })?;
    Ok(requests)
}

/// Seconds from the first to the last timestamp of a Mooncake-style JSONL trace's rows (their
/// `timestamp`s are milliseconds); 0 when fewer than two rows carry one.
pub fn request_span_s(src: impl BufRead + Send) -> Result<f64> {
    let mut span: Option<(f64, f64)> = None;
    for_each_row(src, |_, row| {
        if let Some(t) = row.timestamp {
            span = Some(span.map_or((t, t), |(lo, hi)| (lo.min(t), hi.max(t))));
        }
        Ok(())
    })?;
    Ok(span.map_or(0.0, |(lo, hi)| (hi - lo) / 1000.0))
}

/// Parses every non-blank line into a [`Row`] and hands it on with its line number.
pub(crate) fn for_each_row(
    src: impl BufRead + Send,
    f: impl FnMut(u64, Row) -> Result<()>,
) -> Result<()> {
    for_each_parsed(
        src,
        |line, number| match Row::typed(line) {
            Some(row) => Ok(row),
            None => Row::parse(&object(line, number)?, number),
        },
        f,
    )
}

/// Hands on every non-blank line as a JSON value with its line number, each line bounded
/// before it is parsed.
pub(crate) fn for_each_object(
    src: impl BufRead + Send,
    f: impl FnMut(u64, Json) -> Result<()>,
) -> Result<()> {
    for_each_parsed(src, object, f)
}

/// Lines read on this thread before a second one takes over the reading and parsing: a
/// trace this short is read before a thread would have started.
const LINES_BEFORE_A_THREAD: u64 = 2048;

/// Parsed lines handed over at a time: this many, or fewer whose text reached
/// [`PARSED_BATCH_BYTES`]. Four batches wait at most, so what the thread reads ahead is
/// bounded however long a trace's rows are (a row holds at most 8 bytes of ids for each 2
/// bytes of its text).
const PARSED_BATCH: usize = 256;
const PARSED_BATCH_BYTES: usize = 1 << 20;

/// Parses every non-blank line and hands each on with its number, in order. Past the first
/// [`LINES_BEFORE_A_THREAD`] lines, where there is a second core, a thread reads and parses
/// the lines while this one hands them on: reading and parsing the lines were more than
/// half of reading a Mooncake trace, `f` (interning, sessions) the rest. The first error
/// in line order is the one returned either way: the thread stops at its first, after the
/// lines before it, and stops reading when `f` fails.
fn for_each_parsed<T: Send>(
    src: impl BufRead + Send,
    parse: impl Fn(&str, u64) -> Result<T> + Sync,
    mut f: impl FnMut(u64, T) -> Result<()>,
) -> Result<()> {
    let mut lines = Lines::new(src);
    while lines.number < LINES_BEFORE_A_THREAD {
        let Some((number, value)) = lines.parsed(&parse)? else {
            return Ok(());
        };
        f(number, value)?;
    }
    let two_cores = std::thread::available_parallelism().is_ok_and(|n| n.get() > 1);
    let threaded = two_cores
        .then(|| {
            std::thread::scope(|scope| {
                let (to, parsed) = crossbeam_channel::bounded::<Result<Vec<(u64, T)>>>(4);
                let (lines, parse) = (&mut lines, &parse);
                // A system that refuses the thread leaves the reading to this one.
                std::thread::Builder::new()
                    .name("row parser".into())
                    .spawn_scoped(scope, move || parse_ahead(lines, parse, &to))
                    .ok()?;
                Some(hand_on(parsed, &mut f))
            })
        })
        .flatten();
    if let Some(result) = threaded {
        return result;
    }
    while let Some((number, value)) = lines.parsed(&parse)? {
        f(number, value)?;
    }
    Ok(())
}

/// Hands each parsed line on, in order, up to the first error. Returning drops `parsed`,
/// so a thread still reading stops at its next send.
fn hand_on<T>(
    parsed: crossbeam_channel::Receiver<Result<Vec<(u64, T)>>>,
    f: &mut impl FnMut(u64, T) -> Result<()>,
) -> Result<()> {
    for batch in parsed {
        for (number, value) in batch? {
            f(number, value)?;
        }
    }
    Ok(())
}

/// The reading thread of [`for_each_parsed`]: the lines left, parsed, in batches, then the
/// first error, if one came; it stops when the batches are no longer taken.
fn parse_ahead<R: BufRead, T>(
    lines: &mut Lines<R>,
    parse: &impl Fn(&str, u64) -> Result<T>,
    to: &crossbeam_channel::Sender<Result<Vec<(u64, T)>>>,
) {
    let mut batch = Vec::with_capacity(PARSED_BATCH);
    let mut bytes = 0;
    let end = loop {
        match lines.parsed(parse) {
            Ok(Some(numbered)) => batch.push(numbered),
            Ok(None) => break Ok(()),
            Err(e) => break Err(e),
        }
        bytes += lines.line.len();
        if batch.len() == PARSED_BATCH || bytes >= PARSED_BATCH_BYTES {
            let full = std::mem::replace(&mut batch, Vec::with_capacity(PARSED_BATCH));
            bytes = 0;
            if to.send(Ok(full)).is_err() {
                return;
            }
        }
    };
    if !batch.is_empty() && to.send(Ok(batch)).is_err() {
        return;
    }
    if let Err(e) = end {
        let _ = to.send(Err(e));
    }
}

/// A text input's lines, each bounded before it is read, in one buffer.
struct Lines<R> {
    src: std::io::BufReader<LineLimit<R>>,
    line: String,
    /// The 1-based number of the line last read.
    number: u64,
}

impl<R: BufRead> Lines<R> {
    fn new(src: R) -> Lines<R> {
        Lines {
            src: std::io::BufReader::new(LineLimit::new(src, MAX_LINE_BYTES)),
            line: String::new(),
            number: 0,
        }
    }

    /// The next line that is not blank, parsed, with its number; `None` at the end.
    fn parsed<T>(&mut self, parse: &impl Fn(&str, u64) -> Result<T>) -> Result<Option<(u64, T)>> {
        loop {
            self.line.clear();
            self.number += 1;
            let read = self
                .src
                .read_line(&mut self.line)
                .map_err(|e| Error::io(format!("read failed at line {}", self.number), e))?;
            if read == 0 {
                return Ok(None);
            }
            if !self.line.trim().is_empty() {
                return Ok(Some((self.number, parse(&self.line, self.number)?)));
            }
        }
    }
}

fn object(line: &str, number: u64) -> Result<Json> {
    serde_json::from_str(line)
        .map_err(|e| Error::line(number, "json", format!("not a JSON object: {e}")))
}

/// A row's fields under each of their names, typed as [`Row::parse`] reads them, for
/// [`Row::typed`].
#[derive(Default)]
struct Typed {
    timestamp: Option<f64>,
    created_time: Option<f64>,
    input_length: Option<u64>,
    input_tokens: Option<u64>,
    output_length: Option<u64>,
    output_tokens: Option<u64>,
    hash_ids: Option<Vec<u64>>,
    session_id: Option<String>,
    delay: Option<f64>,
    delay_ms: Option<f64>,
    request_id: Option<String>,
    priority: Option<i64>,
    strict_priority: Option<u64>,
}

/// A key of a row's object: one of [`Typed`]'s names, or another, whose value is still read
/// as a JSON value, so that a line the tree of values refuses (a number out of range where
/// nothing reads it) is refused here too.
#[derive(Clone, Copy)]
enum Name {
    Timestamp,
    CreatedTime,
    InputLength,
    InputTokens,
    OutputLength,
    OutputTokens,
    HashIds,
    SessionId,
    Delay,
    DelayMs,
    RequestId,
    Priority,
    StrictPriority,
    Other,
}

impl<'de> serde::Deserialize<'de> for Name {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Name, D::Error> {
        struct Visitor;
        impl serde::de::Visitor<'_> for Visitor {
            type Value = Name;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a field name")
            }
            fn visit_str<E>(self, name: &str) -> std::result::Result<Name, E> {
                Ok(match name {
                    "timestamp" => Name::Timestamp,
                    "created_time" => Name::CreatedTime,
                    "input_length" => Name::InputLength,
                    "input_tokens" => Name::InputTokens,
                    "output_length" => Name::OutputLength,
                    "output_tokens" => Name::OutputTokens,
                    "hash_ids" => Name::HashIds,
                    "session_id" => Name::SessionId,
                    "delay" => Name::Delay,
                    "delay_ms" => Name::DelayMs,
                    "request_id" => Name::RequestId,
                    "priority" => Name::Priority,
                    "strict_priority" => Name::StrictPriority,
                    _ => Name::Other,
                })
            }
        }
        d.deserialize_identifier(Visitor)
    }
}

impl<'de> serde::Deserialize<'de> for Typed {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Typed, D::Error> {
        struct Visitor;
        impl<'de> serde::de::Visitor<'de> for Visitor {
            type Value = Typed;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a row object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> std::result::Result<Typed, A::Error> {
                let mut t = Typed::default();
                let mut seen = 0u16;
                while let Some(name) = map.next_key::<Name>()? {
                    // A name given twice is left to the tree of values, whose last one
                    // stands.
                    let bit = 1u16 << name as u16;
                    if seen & bit != 0 && !matches!(name, Name::Other) {
                        return Err(serde::de::Error::custom("a name given twice"));
                    }
                    seen |= bit;
                    match name {
                        Name::Timestamp => t.timestamp = map.next_value()?,
                        Name::CreatedTime => t.created_time = map.next_value()?,
                        Name::InputLength => t.input_length = map.next_value()?,
                        Name::InputTokens => t.input_tokens = map.next_value()?,
                        Name::OutputLength => t.output_length = map.next_value()?,
                        Name::OutputTokens => t.output_tokens = map.next_value()?,
                        Name::HashIds => t.hash_ids = map.next_value()?,
                        Name::SessionId => t.session_id = map.next_value()?,
                        Name::Delay => t.delay = map.next_value()?,
                        Name::DelayMs => t.delay_ms = map.next_value()?,
                        Name::RequestId => t.request_id = map.next_value()?,
                        Name::Priority => t.priority = map.next_value()?,
                        Name::StrictPriority => t.strict_priority = map.next_value()?,
                        Name::Other => {
                            map.next_value::<Json>()?;
                        }
                    }
                }
                Ok(t)
            }
        }
        d.deserialize_map(Visitor)
    }
}

/// The fields of one trace row, with their aliases.
#[derive(Default, Debug, PartialEq)]
pub(crate) struct Row {
    pub(crate) timestamp: Option<f64>,
    pub(crate) input_length: Option<u64>,
    pub(crate) output_length: u64,
    pub(crate) hash_ids: Vec<u64>,
    pub(crate) session_id: Option<String>,
    pub(crate) delay: Option<f64>,
    pub(crate) request_id: Option<String>,
    pub(crate) priority: i64,
    pub(crate) strict_priority: u64,
}

/// The first of `names` whose value `row` holds and is not null, with that value.
pub(crate) fn field<'a>(row: &'a Json, names: &[&'static str]) -> Option<(&'static str, &'a Json)> {
    names
        .iter()
        .find_map(|&n| row.get(n).filter(|v| !v.is_null()).map(|v| (n, v)))
}

impl Row {
    /// The row of a line read straight into its fields, without the tree of values
    /// [`Row::parse`] walks (more than a third of reading a Mooncake trace); `None`
    /// wherever that does not give the row [`Row::parse`] would, which then reads the line
    /// and names what is wrong: a line that is not an object, a field of another type, a
    /// name given twice, a value out of range, a missing field.
    fn typed(line: &str) -> Option<Row> {
        if !line.trim_start().starts_with('{') {
            return None;
        }
        let t: Typed = serde_json::from_str(line).ok()?;
        let milliseconds = |x: Option<f64>| match x {
            Some(x) if !(x.is_finite() && x >= 0.0) => None,
            x => Some(x),
        };
        let tokens = |x: Option<u64>| match x {
            Some(x) if x > u64::from(u32::MAX) => None,
            x => Some(x),
        };
        let hash_ids = t.hash_ids.filter(|ids| ids.len() <= MAX_HASH_IDS_PER_ROW)?;
        Some(Row {
            timestamp: milliseconds(t.timestamp.or(t.created_time))?,
            input_length: tokens(t.input_length.or(t.input_tokens))?,
            output_length: tokens(t.output_length.or(t.output_tokens))??,
            hash_ids,
            session_id: t.session_id,
            delay: milliseconds(t.delay.or(t.delay_ms))?,
            request_id: t.request_id,
            priority: t.priority.unwrap_or(0),
            strict_priority: tokens(t.strict_priority)?.unwrap_or(0),
        })
    }

    pub(crate) fn parse(row: &Json, line: u64) -> Result<Row> {
        if !row.is_object() {
            return Err(Error::line(
                line,
                "json",
                "expected one JSON object per line",
            ));
        }
        let wrong =
            |name: &str, expected: &str| Error::line(line, name, format!("expected {expected}"));
        let number = |names: &[&'static str]| -> Result<Option<f64>> {
            field(row, names)
                .map(|(n, v)| {
                    v.as_f64()
                        .filter(|x| x.is_finite() && *x >= 0.0)
                        .ok_or_else(|| wrong(n, "a non-negative number of milliseconds"))
                })
                .transpose()
        };
        let count = |names: &[&'static str]| -> Result<Option<u64>> {
            field(row, names)
                .map(|(n, v)| {
                    v.as_u64()
                        .filter(|&x| x <= u64::from(u32::MAX))
                        .ok_or_else(|| wrong(n, "a non-negative integer token count"))
                })
                .transpose()
        };
        let text = |name: &'static str| -> Result<Option<String>> {
            field(row, &[name])
                .map(|(n, v)| {
                    v.as_str()
                        .map(str::to_owned)
                        .ok_or_else(|| wrong(n, "a JSON string"))
                })
                .transpose()
        };
        let hash_ids = match row.get("hash_ids") {
            None | Some(Json::Null) => {
                return Err(Error::line(line, "hash_ids", "missing field"));
            }
            Some(Json::Array(ids)) if ids.len() > MAX_HASH_IDS_PER_ROW => {
                return Err(Error::line(
                    line,
                    "hash_ids",
                    format!(
                        "{} ids: more than the {MAX_HASH_IDS_PER_ROW} one request may name",
                        ids.len()
                    ),
                ));
            }
            Some(Json::Array(ids)) => ids
                .iter()
                .map(|v| {
                    v.as_u64()
                        .ok_or_else(|| wrong("hash_ids", "an array of non-negative integers"))
                })
                .collect::<Result<Vec<u64>>>()?,
            Some(_) => return Err(wrong("hash_ids", "an array of non-negative integers")),
        };
        let output_length = count(&["output_length", "output_tokens"])?
            .ok_or_else(|| Error::line(line, "output_length", "missing field"))?;
        Ok(Row {
            timestamp: number(&["timestamp", "created_time"])?,
            input_length: count(&["input_length", "input_tokens"])?,
            output_length,
            hash_ids,
            session_id: text("session_id")?,
            delay: number(&["delay", "delay_ms"])?,
            request_id: text("request_id")?,
            priority: match field(row, &["priority"]) {
                None => 0,
                Some((n, v)) => v.as_i64().ok_or_else(|| wrong(n, "an integer"))?,
            },
            strict_priority: count(&["strict_priority"])?.unwrap_or(0),
        })
    }

    /// The row's request. A prompt longer than its hash ids cover is an error (the trace was
    /// written with another block size); ids beyond the prompt are ignored.
    pub(crate) fn turn(&self, line: u64, block: u32, ids: &mut Interner) -> Result<Turn> {
        let capacity = self.hash_ids.len() as u64 * u64::from(block);
        let len = self.input_length.unwrap_or(capacity);
        if len == 0 {
            let field = if self.input_length.is_some() {
                "input_length"
            } else {
                "hash_ids"
            };
            return Err(Error::line(
                line,
                field,
                "a request needs at least one prompt token",
            ));
        }
        if len > capacity {
            return Err(Error::line(
                line,
                "hash_ids",
                format!(
                    "{} ids of {block} tokens cover {capacity} tokens but input_length is {len}; \
                     {GIVE_BLOCK_SIZE}",
                    self.hash_ids.len()
                ),
            ));
        }
        let used = len.div_ceil(u64::from(block.max(1))) as usize;
        let interned = self.hash_ids[..used]
            .iter()
            .map(|&h| ids.intern(h, line))
            .collect::<Result<Vec<u32>>>()?;
        Ok(Turn {
            prompt: Prompt::from_blocks(&interned, block, len as u32),
            output_length: self.output_length as u32,
            output_content: None,
            delay_ms: 0.0,
            request_id: self.request_id.clone(),
            priority: self.priority,
            strict_priority: self.strict_priority,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Workload> {
        read_mooncake(text.as_bytes(), 512)
    }

    #[test]
    fn rows_become_sessions_with_interned_ids_and_aliases() {
        let w = parse(
            "{\"timestamp\": 500, \"input_length\": 600, \"output_length\": 5, \"hash_ids\": [7, 9]}\n\
             {\"created_time\": 700, \"input_tokens\": 10, \"output_tokens\": 2, \"hash_ids\": [9, 3], \"session_id\": \"s\"}\n\
             {\"timestamp\": 900, \"input_length\": 10, \"output_length\": 2, \"hash_ids\": [3], \"session_id\": \"s\"}\n\
             {\"timestamp\": 950, \"output_length\": 2, \"hash_ids\": [3], \"session_id\": \"s\", \"delay_ms\": 40}\n",
        )
        .expect("parse");
        assert_eq!(w.sessions.len(), 2);
        assert_eq!(w.sessions[0].start_ms, 0.0, "first arrival is time 0");
        assert_eq!(
            w.sessions[0].turns[0].prompt.ids().collect::<Vec<_>>(),
            [0, 1]
        );
        let s = &w.sessions[1];
        assert_eq!(s.start_ms, 200.0);
        assert_eq!(
            s.turns[0].prompt.ids().collect::<Vec<_>>(),
            [1],
            "ids beyond the prompt are dropped"
        );
        assert_eq!(s.turns[1].delay_ms, 200.0, "timestamp delta");
        assert_eq!(s.turns[2].delay_ms, 40.0, "explicit delay");
        assert_eq!(
            s.turns[2].prompt.len, 512,
            "input length defaults to capacity"
        );
    }

    /// A row read straight into its fields is the row the tree of values gives, and a line
    /// that tree refuses is never read straight: over random rows whose fields take every
    /// type, range, alias, null and repetition either reading has a rule for.
    #[test]
    fn rows_read_straight_are_the_rows_the_values_give() {
        const NAMES: [&str; 15] = [
            "timestamp",
            "created_time",
            "input_length",
            "input_tokens",
            "output_length",
            "output_tokens",
            "hash_ids",
            "session_id",
            "delay",
            "delay_ms",
            "request_id",
            "priority",
            "strict_priority",
            "extra",
            "hash_\\u0069ds",
        ];
        const VALUES: [&str; 22] = [
            "0",
            "7",
            "-0",
            "-3",
            "2.5",
            "-0.5",
            "1e3",
            "4294967295",
            "4294967296",
            "18446744073709551616",
            "9223372036854775808",
            "null",
            "true",
            "\"s\"",
            "\"\\u00e9\"",
            "[]",
            "[1, 2, 3]",
            "[1, -2]",
            "[1.5]",
            "[null]",
            "{\"a\": [1]}",
            "1e400",
        ];
        let mut rng = crate::rng::SplitMix64::new(5);
        let (mut straight, mut refused) = (0, 0);
        for i in 0..40_000 {
            let mut fields = vec![
                format!("\"hash_ids\": [{}, 2]", i % 7),
                format!("\"output_length\": {}", i % 5),
            ];
            for _ in 0..rng.range(0, 5) {
                let name = NAMES[rng.range(0, NAMES.len() as u64 - 1) as usize];
                let value = VALUES[rng.range(0, VALUES.len() as u64 - 1) as usize];
                fields.push(format!("\"{name}\": {value}"));
            }
            if i % 3 == 0 {
                let other = rng.range(0, fields.len() as u64 - 1) as usize;
                fields.swap(0, other);
            }
            let line = match i % 50 {
                0 => format!("[{}]", fields.join(", ")),
                1 => format!("{{{}}} x", fields.join(", ")),
                _ => format!("  {{{}}}\n", fields.join(", ")),
            };
            let slow = object(&line, 1).and_then(|json| Row::parse(&json, 1));
            match (Row::typed(&line), slow) {
                (Some(fast), Ok(slow)) => {
                    assert_eq!(fast, slow, "{line}");
                    straight += 1;
                }
                (Some(fast), Err(e)) => panic!("{line}: read straight as {fast:?}, but {e}"),
                (None, Err(_)) => refused += 1,
                (None, Ok(_)) => {}
            }
        }
        assert!(straight > 5_000 && refused > 10_000, "{straight} {refused}");
    }

    /// Lines parsed on a second thread reach `f` in order with their numbers, blank lines
    /// skipped, batches ended by count or by size; the error returned is the first in line
    /// order, whether `f` or the parser found it.
    #[test]
    fn lines_parsed_ahead_keep_their_order_and_first_error() {
        let mut text = String::new();
        for i in 1..=10_000u64 {
            text += &match i {
                _ if i % 7 == 0 => "  \n".to_owned(),
                // Long lines end their batches by size.
                _ if i % 100 == 1 => format!("{i}{}\n", " ".repeat(300_000)),
                _ => format!("{i}\n"),
            };
        }
        let parse = |line: &str, number: u64| -> Result<u64> {
            let value: u64 = line
                .trim()
                .parse()
                .map_err(|_| Error::line(number, "n", "not a number"))?;
            assert_eq!(value, number, "each line holds its own number");
            Ok(value)
        };
        let mut seen = Vec::new();
        for_each_parsed(text.as_bytes(), parse, |n, v| {
            seen.push((n, v));
            Ok(())
        })
        .expect("read");
        let expected: Vec<(u64, u64)> = (1..=10_000)
            .filter(|i| i % 7 != 0)
            .map(|i| (i, i))
            .collect();
        assert_eq!(seen, expected);

        let bad = text.replace("\n6000\n", "\nx\n");
        let fail_at = |stop: u64| {
            for_each_parsed(bad.as_bytes(), parse, |n, _| {
                if n == stop {
                    return Err(Error::line(n, "f", "refused"));
                }
                Ok(())
            })
            .expect_err("an error")
            .to_string()
        };
        assert!(fail_at(3000).contains("line 3000: f"), "{}", fail_at(3000));
        assert!(fail_at(9000).contains("line 6000: n"), "{}", fail_at(9000));
        assert!(fail_at(100).contains("line 100: f"), "{}", fail_at(100));
    }

    #[test]
    fn bad_rows_name_their_line_and_field() {
        let cases = [
            ("{\"output_length\": 1}", "line 1: hash_ids: missing field"),
            (
                "\n{\"hash_ids\": [1], \"output_length\": \"x\"}",
                "line 2: output_length: expected",
            ),
            (
                "{\"hash_ids\": [1], \"input_length\": 600, \"output_length\": 1}",
                "give the trace's block size",
            ),
            (
                "{\"hash_ids\": [1], \"output_length\": 1, \"session_id\": 4}",
                "session_id: expected a JSON string",
            ),
            (
                "{\"hash_ids\": [1], \"output_length\": 1, \"session_id\": \"a\", \"delay\": 3}",
                "first turn",
            ),
            ("[1]", "line 1: json"),
            (
                "{\"timestamp\": 0, \"output_length\": 10, \"hash_ids\": []}",
                "line 1: hash_ids: a request needs at least one prompt token",
            ),
            (
                "{\"input_length\": 0, \"output_length\": 10, \"hash_ids\": [1]}",
                "line 1: input_length: a request needs at least one prompt token",
            ),
        ];
        for (text, expected) in cases {
            let e = parse(text).expect_err(text).to_string();
            assert!(e.contains(expected), "{text}: {e}");
        }
    }
}
