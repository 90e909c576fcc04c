//! A trace as Arrow record batches: one row per frame (the records view) or one row per key of
//! every call (the keys view). The frames are decoded on every core a block at a time, each
//! block becoming one batch, and the batches come out in stream order through a bounded
//! queue, so a trace of any size is read in the memory of a few blocks.

use std::path::Path;
use std::sync::Arc;
use std::thread::JoinHandle;

use arrow_array::builder::{
    BinaryBuilder, Float64Builder, Int64Builder, ListBuilder, StringBuilder, UInt32Builder,
    UInt64Builder,
};
use arrow_array::{ArrayRef, RecordBatch, RecordBatchReader};
use arrow_schema::{ArrowError, DataType, Field, Schema, SchemaRef};
use crossbeam_channel::{bounded, Receiver};
use kvtrace_io::error::{Error, Result};
use kvtrace_lmct::args::{Arg, CallArgs};
use kvtrace_lmct::blocks::fold_frames;
use kvtrace_lmct::calls::short_name;
use kvtrace_lmct::codec::ObjectKeyRef;
use kvtrace_lmct::display::{to_display, Shown};
use kvtrace_lmct::msgpack::RawValue;
use kvtrace_lmct::{Frame, ReadOptions, ReadSummary, RecordRef, TraceReader};

/// Bytes of frames decoded into one batch: about 2,000 rows of an LMCache-written trace.
const BLOCK_BYTES: usize = 4 << 20;

/// Batches decoded ahead of the consumer.
const QUEUED_BATCHES: usize = 4;

/// Which rows a trace becomes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum View {
    /// One row per frame after the header, undecodable frames included.
    Records,
    /// One row per key a call names (or an events batch's entry names), in call order.
    Keys,
}

impl View {
    pub fn parse(name: &str) -> Option<View> {
        match name {
            "records" => Some(View::Records),
            "keys" => Some(View::Keys),
            _ => None,
        }
    }

    /// Every column of the view, in schema order.
    pub fn columns(self) -> &'static [Column] {
        use Column::*;
        match self {
            View::Records => &[
                Frame,
                Offset,
                Len,
                TMono,
                TWall,
                Qualname,
                Call,
                RequestId,
                NumKeys,
                Keys,
                EventType,
                Tier,
                Undecodable,
                Args,
            ],
            View::Keys => &[
                Frame,
                TMono,
                TWall,
                Call,
                RequestId,
                EventType,
                Tier,
                Position,
                Group,
                ChunkHash,
                ModelName,
                KvRank,
                ObjectGroupId,
                CacheSalt,
                SizeBytes,
            ],
        }
    }

    /// The columns read when none are named: all of them but `args`, whose JSON text costs
    /// more than the rest of the row together.
    pub fn default_columns(self) -> Vec<Column> {
        self.columns()
            .iter()
            .copied()
            .filter(|c| *c != Column::Args)
            .collect()
    }

    /// The columns named, in the order named; an unknown or repeated name is a usage error
    /// that lists the view's columns.
    pub fn select<S: AsRef<str>>(self, names: &[S]) -> Result<Vec<Column>> {
        let mut out: Vec<Column> = Vec::new();
        for name in names {
            let name = name.as_ref();
            let column = self
                .columns()
                .iter()
                .copied()
                .find(|c| c.name() == name)
                .ok_or_else(|| {
                    let known: Vec<&str> = self.columns().iter().map(|c| c.name()).collect();
                    Error::usage(format!(
                        "column {name:?}: the {} view has {}",
                        self.name(),
                        known.join(", ")
                    ))
                })?;
            if out.contains(&column) {
                return Err(Error::usage(format!("column {name:?} named twice")));
            }
            out.push(column);
        }
        if out.is_empty() {
            return Err(Error::usage("no columns named"));
        }
        Ok(out)
    }

    pub fn name(self) -> &'static str {
        match self {
            View::Records => "records",
            View::Keys => "keys",
        }
    }
}

/// One column of a view. The names and types are a contract (docs/guides/columnar.md).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Column {
    /// The frame's index: 1 for the first after the header, as `dump` numbers them.
    Frame,
    /// Where its length prefix starts in the (decompressed) stream.
    Offset,
    /// Bytes of its body.
    Len,
    /// Seconds since the header's `t_mono_start`.
    TMono,
    /// Unix time in seconds.
    TWall,
    Qualname,
    /// The qualname after the StorageManager prefix (`finish_write`,
    /// `read_prefetched_results.enter`); an events record keeps its own name.
    Call,
    /// `external_request_id`, where the call has one.
    RequestId,
    NumKeys,
    /// The keys' chunk hashes, in call order.
    Keys,
    /// An events batch's `event_type` and `tier`.
    EventType,
    Tier,
    /// Why a frame could not be decoded (the frame's other fields are then null).
    Undecodable,
    /// The call's arguments as `dump` shows them (JSON text).
    Args,
    /// The key's place among the call's keys, from 0.
    Position,
    /// The prefetch spec's key group the key belongs to (0 for a plain key list).
    Group,
    ChunkHash,
    ModelName,
    KvRank,
    ObjectGroupId,
    CacheSalt,
    /// An events entry's `size_bytes`.
    SizeBytes,
}

impl Column {
    pub fn name(self) -> &'static str {
        match self {
            Column::Frame => "frame",
            Column::Offset => "offset",
            Column::Len => "len",
            Column::TMono => "t_mono",
            Column::TWall => "t_wall",
            Column::Qualname => "qualname",
            Column::Call => "call",
            Column::RequestId => "request_id",
            Column::NumKeys => "num_keys",
            Column::Keys => "keys",
            Column::EventType => "event_type",
            Column::Tier => "tier",
            Column::Undecodable => "undecodable",
            Column::Args => "args",
            Column::Position => "position",
            Column::Group => "group",
            Column::ChunkHash => "chunk_hash",
            Column::ModelName => "model_name",
            Column::KvRank => "kv_rank",
            Column::ObjectGroupId => "object_group_id",
            Column::CacheSalt => "cache_salt",
            Column::SizeBytes => "size_bytes",
        }
    }

    fn field(self, view: View) -> Field {
        let (data_type, nullable) = match self {
            Column::Frame | Column::Offset => (DataType::UInt64, false),
            Column::Len | Column::Position | Column::Group => (DataType::UInt32, false),
            Column::NumKeys => (DataType::UInt32, view == View::Records),
            Column::TMono | Column::TWall => (DataType::Float64, view == View::Records),
            Column::Call => (DataType::Utf8, view == View::Records),
            Column::Qualname
            | Column::RequestId
            | Column::EventType
            | Column::Tier
            | Column::Undecodable
            | Column::Args
            | Column::CacheSalt => (DataType::Utf8, true),
            Column::Keys => (
                DataType::List(Arc::new(Field::new_list_field(DataType::Binary, false))),
                true,
            ),
            Column::ChunkHash => (DataType::Binary, false),
            Column::ModelName => (DataType::Utf8, false),
            Column::KvRank | Column::ObjectGroupId => (DataType::Int64, false),
            Column::SizeBytes => (DataType::UInt64, true),
        };
        Field::new(self.name(), data_type, nullable)
    }
}

/// The schema of `columns` in `view`, with the trace's header as metadata
/// (`kvtrace.header`: the header as `dump` shows it; `kvtrace.view`).
pub fn schema(view: View, columns: &[Column], header: &str) -> Schema {
    let fields: Vec<Field> = columns.iter().map(|c| c.field(view)).collect();
    Schema::new(fields).with_metadata(
        [
            ("kvtrace.view".to_owned(), view.name().to_owned()),
            ("kvtrace.header".to_owned(), header.to_owned()),
        ]
        .into_iter()
        .collect::<std::collections::HashMap<String, String>>(),
    )
}

/// One key as a row of the keys view.
struct KeyRow<'a> {
    group: u32,
    chunk_hash: std::borrow::Cow<'a, [u8]>,
    model_name: &'a str,
    kv_rank: i64,
    object_group_id: i64,
    cache_salt: Option<&'a str>,
    size_bytes: Option<u64>,
}

impl<'a> KeyRow<'a> {
    fn of(group: u32, k: &ObjectKeyRef<'a>) -> KeyRow<'a> {
        KeyRow {
            group,
            chunk_hash: k.chunk_hash.into(),
            model_name: k.model_name,
            kv_rank: k.kv_rank,
            object_group_id: k.object_group_id,
            cache_salt: k.cache_salt,
            size_bytes: None,
        }
    }
}

/// What a record says, read once for every column that needs it.
struct Call<'a> {
    request_id: Option<&'a str>,
    event_type: Option<&'a str>,
    tier: Option<&'a str>,
    keys: Vec<KeyRow<'a>>,
}

impl<'a> Call<'a> {
    fn read(record: &RecordRef<'a>, keys: bool) -> Call<'a> {
        if record.qualname == "events.batch" {
            return Call::read_events(record.args, keys);
        }
        let mut call = Call {
            request_id: None,
            event_type: None,
            tier: None,
            keys: Vec::new(),
        };
        let Some(args) = CallArgs::of(record) else {
            return call;
        };
        call.request_id = args.request_id.valid().copied();
        if !keys {
            return call;
        }
        match (&args.keys, &args.spec) {
            (Arg::Valid(k), _) => call.keys = k.keys.iter().map(|k| KeyRow::of(0, k)).collect(),
            (Arg::Absent, Arg::Valid(spec)) => {
                for (g, group) in spec.groups.iter().enumerate() {
                    let g = u32::try_from(g).unwrap_or(u32::MAX);
                    call.keys
                        .extend(group.keys.keys.iter().map(|k| KeyRow::of(g, k)));
                }
            }
            _ => {}
        }
        call
    }

    /// An events batch: its type, tier and each entry's key (`chunk_hash_hex` as bytes).
    fn read_events(args: RawValue<'a>, keys: bool) -> Call<'a> {
        let text = |name: &str| args.get(name).and_then(|v| v.as_str());
        let mut call = Call {
            request_id: None,
            event_type: text("event_type"),
            tier: text("tier"),
            keys: Vec::new(),
        };
        if !keys {
            return call;
        }
        let Some(entries) = args.get("entries").and_then(|e| e.array()) else {
            return call;
        };
        for entry in entries {
            let Some(key) = entry.get("key") else {
                continue;
            };
            let field = |name: &str| key.get(name);
            let hash = field("chunk_hash_hex")
                .and_then(|h| h.as_str())
                .unwrap_or("");
            // A hash that is not hex stays its text's bytes: nothing the trace holds is lost.
            let chunk_hash = hex::decode(hash).map_or_else(|_| hash.as_bytes().into(), Into::into);
            call.keys.push(KeyRow {
                group: 0,
                chunk_hash,
                model_name: field("model_name").and_then(|v| v.as_str()).unwrap_or(""),
                kv_rank: field("kv_rank").and_then(|v| v.as_i64()).unwrap_or(0),
                object_group_id: field("object_group_id")
                    .and_then(|v| v.as_i64())
                    .unwrap_or(0),
                cache_salt: field("cache_salt").and_then(|v| v.as_str()),
                size_bytes: entry.get("size_bytes").and_then(|v| v.as_u64()),
            });
        }
        call
    }
}

/// The builders of one batch; only the selected columns are filled.
struct Builders {
    view: View,
    columns: Arc<[Column]>,
    keys_needed: bool,
    u64s: Vec<UInt64Builder>,
    u32s: Vec<UInt32Builder>,
    i64s: Vec<Int64Builder>,
    f64s: Vec<Float64Builder>,
    strings: Vec<StringBuilder>,
    binaries: Vec<BinaryBuilder>,
    lists: Vec<ListBuilder<BinaryBuilder>>,
    /// Which builder of its kind each column fills.
    slots: Vec<usize>,
    /// The last qualname and its short name: calls repeat a handful of names.
    last_call: Option<(String, String)>,
    /// The `args` column's text of one row, the buffer kept from row to row.
    text: Vec<u8>,
}

impl Builders {
    fn new(view: View, columns: Arc<[Column]>) -> Builders {
        let mut b = Builders {
            view,
            keys_needed: view == View::Keys
                || columns.contains(&Column::Keys)
                || columns.contains(&Column::NumKeys),
            columns: columns.clone(),
            u64s: Vec::new(),
            u32s: Vec::new(),
            i64s: Vec::new(),
            f64s: Vec::new(),
            strings: Vec::new(),
            binaries: Vec::new(),
            lists: Vec::new(),
            slots: Vec::new(),
            last_call: None,
            text: Vec::new(),
        };
        for c in columns.iter() {
            let slot = match c.field(view).data_type() {
                DataType::UInt64 => push(&mut b.u64s, UInt64Builder::new()),
                DataType::UInt32 => push(&mut b.u32s, UInt32Builder::new()),
                DataType::Int64 => push(&mut b.i64s, Int64Builder::new()),
                DataType::Float64 => push(&mut b.f64s, Float64Builder::new()),
                DataType::Binary => push(&mut b.binaries, BinaryBuilder::new()),
                DataType::List(_) => push(
                    &mut b.lists,
                    ListBuilder::new(BinaryBuilder::new())
                        .with_field(Field::new_list_field(DataType::Binary, false)),
                ),
                _ => push(&mut b.strings, StringBuilder::new()),
            };
            b.slots.push(slot);
        }
        b
    }

    fn call_name(&mut self, qualname: &str) -> &str {
        if self.last_call.as_ref().is_none_or(|(q, _)| q != qualname) {
            self.last_call = Some((qualname.to_owned(), short_name(qualname)));
        }
        self.last_call.as_ref().map_or("", |(_, s)| s.as_str())
    }

    fn add(&mut self, index: u64, frame: &Frame<'_>) {
        match frame {
            Frame::Record(record) => {
                let call = Call::read(record, self.keys_needed);
                match self.view {
                    View::Records => self.add_record(index, record, &call),
                    View::Keys => {
                        for (position, key) in call.keys.iter().enumerate() {
                            self.add_key(index, record, &call, position, key);
                        }
                    }
                }
            }
            Frame::Undecodable {
                offset,
                body,
                reason,
            } if self.view == View::Records => {
                for i in 0..self.columns.len() {
                    let c = self.columns[i];
                    let slot = self.slots[i];
                    match c {
                        Column::Frame => self.u64s[slot].append_value(index),
                        Column::Offset => self.u64s[slot].append_value(*offset),
                        Column::Len => self.u32s[slot].append_value(len32(body.len())),
                        Column::Undecodable => self.strings[slot].append_value(reason),
                        Column::NumKeys => self.u32s[slot].append_null(),
                        Column::TMono | Column::TWall => self.f64s[slot].append_null(),
                        Column::Keys => self.lists[slot].append_null(),
                        _ => self.strings[slot].append_null(),
                    }
                }
            }
            Frame::Undecodable { .. } => {}
        }
    }

    fn add_record(&mut self, index: u64, record: &RecordRef<'_>, call: &Call<'_>) {
        for i in 0..self.columns.len() {
            let c = self.columns[i];
            let slot = self.slots[i];
            match c {
                Column::Frame => self.u64s[slot].append_value(index),
                Column::Offset => self.u64s[slot].append_value(record.offset),
                Column::Len => self.u32s[slot].append_value(len32(record.body.len())),
                Column::TMono => self.f64s[slot].append_value(record.t_mono),
                Column::TWall => self.f64s[slot].append_value(record.t_wall),
                Column::Qualname => self.strings[slot].append_value(record.qualname),
                Column::Call => {
                    let name = self.call_name(record.qualname).to_owned();
                    self.strings[slot].append_value(name);
                }
                Column::RequestId => self.strings[slot].append_option(call.request_id),
                Column::NumKeys => self.u32s[slot].append_value(len32(call.keys.len())),
                Column::Keys => {
                    let list = &mut self.lists[slot];
                    for k in &call.keys {
                        list.values().append_value(&k.chunk_hash);
                    }
                    list.append(true);
                }
                Column::EventType => self.strings[slot].append_option(call.event_type),
                Column::Tier => self.strings[slot].append_option(call.tier),
                Column::Undecodable => self.strings[slot].append_null(),
                Column::Args => {
                    self.text.clear();
                    Shown::args(record).write_compact(&mut self.text);
                    // The text is JSON written from UTF-8 strings and ASCII: never replaced.
                    self.strings[slot].append_value(String::from_utf8_lossy(&self.text));
                }
                _ => {}
            }
        }
    }

    fn add_key(
        &mut self,
        index: u64,
        record: &RecordRef<'_>,
        call: &Call<'_>,
        position: usize,
        key: &KeyRow<'_>,
    ) {
        for i in 0..self.columns.len() {
            let c = self.columns[i];
            let slot = self.slots[i];
            match c {
                Column::Frame => self.u64s[slot].append_value(index),
                Column::TMono => self.f64s[slot].append_value(record.t_mono),
                Column::TWall => self.f64s[slot].append_value(record.t_wall),
                Column::Call => {
                    let name = self.call_name(record.qualname).to_owned();
                    self.strings[slot].append_value(name);
                }
                Column::RequestId => self.strings[slot].append_option(call.request_id),
                Column::EventType => self.strings[slot].append_option(call.event_type),
                Column::Tier => self.strings[slot].append_option(call.tier),
                Column::Position => self.u32s[slot].append_value(len32(position)),
                Column::Group => self.u32s[slot].append_value(key.group),
                Column::ChunkHash => self.binaries[slot].append_value(&key.chunk_hash),
                Column::ModelName => self.strings[slot].append_value(key.model_name),
                Column::KvRank => self.i64s[slot].append_value(key.kv_rank),
                Column::ObjectGroupId => self.i64s[slot].append_value(key.object_group_id),
                Column::CacheSalt => self.strings[slot].append_option(key.cache_salt),
                Column::SizeBytes => self.u64s[slot].append_option(key.size_bytes),
                _ => {}
            }
        }
    }

    fn finish(mut self, schema: &SchemaRef) -> std::result::Result<RecordBatch, ArrowError> {
        let mut arrays: Vec<ArrayRef> = Vec::with_capacity(self.columns.len());
        for (i, c) in self.columns.iter().enumerate() {
            let slot = self.slots[i];
            let array: ArrayRef = match c.field(self.view).data_type() {
                DataType::UInt64 => Arc::new(self.u64s[slot].finish()),
                DataType::UInt32 => Arc::new(self.u32s[slot].finish()),
                DataType::Int64 => Arc::new(self.i64s[slot].finish()),
                DataType::Float64 => Arc::new(self.f64s[slot].finish()),
                DataType::Binary => Arc::new(self.binaries[slot].finish()),
                DataType::List(_) => Arc::new(self.lists[slot].finish()),
                _ => Arc::new(self.strings[slot].finish()),
            };
            arrays.push(array);
        }
        RecordBatch::try_new(schema.clone(), arrays)
    }
}

fn push<T>(v: &mut Vec<T>, item: T) -> usize {
    v.push(item);
    v.len() - 1
}

/// A frame or key count as the `UInt32` columns hold it (frames are at most 4 GiB).
fn len32(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// A trace being read as record batches, in stream order. Reading happens on background
/// threads a few batches ahead; dropping the reader stops them.
pub struct TraceBatches {
    schema: SchemaRef,
    batches: Receiver<std::result::Result<RecordBatch, ArrowError>>,
    reading: Option<JoinHandle<Result<ReadSummary>>>,
    /// The read's summary once the last batch was taken.
    summary: Option<ReadSummary>,
    /// The error that ended the read, kept whole for the caller's one-line message.
    failure: Option<Error>,
}

impl TraceBatches {
    /// Opens `path` (any LMCT variant, `.lct.zst` included) and starts reading `columns` of
    /// `view` on `read.threads` threads.
    pub fn open(path: &Path, view: View, columns: &[Column], read: ReadOptions) -> Result<Self> {
        let shown = path.display().to_string();
        let reader = TraceReader::open(path, read).map_err(|e| e.in_file(&shown))?;
        Ok(TraceBatches::start(
            reader,
            view,
            columns,
            read.threads(),
            shown,
        ))
    }

    /// Starts reading an opened trace; `shown` names it in errors.
    pub fn start(
        reader: TraceReader,
        view: View,
        columns: &[Column],
        threads: usize,
        shown: String,
    ) -> TraceBatches {
        let header = RawValue::parse(reader.header_body())
            .map(|h| to_display(h).to_string())
            .unwrap_or_default();
        let schema: SchemaRef = Arc::new(schema(view, columns, &header));
        let (tx, rx) = bounded(QUEUED_BATCHES);
        let columns: Arc<[Column]> = columns.into();
        let batch_schema = schema.clone();
        let reading = std::thread::spawn(move || {
            let init = || Builders::new(view, columns.clone());
            fold_frames(
                reader,
                threads,
                BLOCK_BYTES,
                &init,
                &|builders, index, frame| builders.add(index, frame),
                &mut |builders| tx.send(builders.finish(&batch_schema)).is_ok(),
                &|_, _| {},
            )
            .map_err(|e| e.in_file(&shown))
        });
        TraceBatches {
            schema,
            batches: rx,
            reading: Some(reading),
            summary: None,
            failure: None,
        }
    }

    /// What the reader saw (records, undecodable frames, a truncated tail), once every batch
    /// was taken.
    pub fn summary(&self) -> Option<&ReadSummary> {
        self.summary.as_ref()
    }

    /// The error that ended the read early, as kvtrace reports it.
    pub fn failure(&self) -> Option<&Error> {
        self.failure.as_ref()
    }

    fn join(&mut self) {
        let Some(reading) = self.reading.take() else {
            return;
        };
        match reading.join() {
            Ok(Ok(summary)) => self.summary = Some(summary),
            Ok(Err(e)) => self.failure = Some(e),
            Err(_) => self.failure = Some(Error::bad_input("the trace reader stopped")),
        }
    }
}

impl Iterator for TraceBatches {
    type Item = std::result::Result<RecordBatch, ArrowError>;

    fn next(&mut self) -> Option<Self::Item> {
        if let Ok(batch) = self.batches.recv() {
            return Some(batch);
        }
        self.reading.as_ref()?;
        self.join();
        self.failure
            .as_ref()
            .map(|e| Err(ArrowError::ExternalError(Box::new(e.clone()))))
    }
}

impl RecordBatchReader for TraceBatches {
    fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }
}
