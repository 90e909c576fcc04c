//! Whole frames in large blocks, for decoding on several threads: one thread reads and frames
//! the stream (only the 4-byte length prefixes are looked at), workers decode the blocks'
//! frames, and [`fold_records`] puts their results back in stream order — the same records,
//! skips, truncation and summary as [`TraceReader::next_record`], in a fraction of the time.
//!
//! [`TraceReader::next_record`]: super::TraceReader::next_record

use std::collections::BTreeMap;
use std::io::Read;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use crossbeam_channel::{bounded, unbounded, Receiver, Sender};

use super::frame::RecordSpans;
use super::reader::{ReadSummary, Truncation, KEPT_SKIP_REASONS};
use super::{Frame, RecordRef, TraceReader};
use kvtrace_io::error::{Error, Result};

/// Frames after the header, a block at a time.
pub struct Blocks {
    src: Box<dyn Read + Send>,
    /// Stream offset of the first byte not yet handed out.
    next_offset: u64,
    /// Frames handed out so far.
    frames: u64,
    max_frame_bytes: u32,
    /// The reader's [`crate::ReadOptions::stop`].
    stop: fn() -> bool,
    summary: ReadSummary,
    block_bytes: usize,
    /// Bytes read past the last whole frame handed out.
    carry: Vec<u8>,
    /// The source has no more bytes.
    exhausted: bool,
    /// What a zstd source reported when it failed.
    cause: Option<String>,
    finished: bool,
}

/// Reads until `buf` is full or the source ends; returns the bytes read and the error that
/// stopped it, if one did — the bytes before an error are kept (a zstd stream that ends early
/// still yields everything it decoded).
fn fill(src: &mut dyn Read, buf: &mut [u8]) -> (usize, Option<std::io::Error>) {
    let mut got = 0;
    while got < buf.len() {
        match src.read(&mut buf[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return (got, Some(e)),
        }
    }
    (got, None)
}

/// Whole frames (length prefix and body each) starting at stream offset `start`.
pub struct Block {
    pub start: u64,
    /// Frames before this block's first (the header not counted).
    pub frames_before: u64,
    /// A recycled buffer: its first `len` bytes are the frames, the rest is left over from
    /// earlier blocks (kept initialized so that reading into it never zero-fills again).
    bytes: Vec<u8>,
    len: usize,
}

impl Block {
    /// Bytes of the frames.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Every frame: its stream offset and body.
    pub fn frames(&self) -> impl Iterator<Item = (u64, &[u8])> {
        let bytes = &self.bytes[..self.len];
        let mut at = 0usize;
        std::iter::from_fn(move || {
            let prefix = bytes.get(at..at + 4)?;
            let len = u32::from_be_bytes([prefix[0], prefix[1], prefix[2], prefix[3]]) as usize;
            let body = bytes.get(at + 4..at + 4 + len)?;
            let offset = self.start + at as u64;
            at += 4 + len;
            Some((offset, body))
        })
    }

    /// The bytes at `range` of the block.
    fn body(&self, range: std::ops::Range<usize>) -> &[u8] {
        &self.bytes[..self.len][range]
    }

    /// The buffer, to read the next block into.
    pub fn into_buffer(self) -> Vec<u8> {
        self.bytes
    }
}

impl Blocks {
    pub(super) fn new(
        src: Box<dyn Read + Send>,
        next_offset: u64,
        max_frame_bytes: u32,
        stop: fn() -> bool,
        summary: ReadSummary,
        block_bytes: usize,
    ) -> Blocks {
        Blocks {
            src,
            next_offset,
            frames: 0,
            max_frame_bytes,
            stop,
            summary,
            block_bytes: block_bytes.max(4096),
            carry: Vec::new(),
            exhausted: false,
            cause: None,
            finished: false,
        }
    }

    /// The next block of whole frames (about `block_bytes`, more when one frame is larger),
    /// `None` at the end: clean, or a truncated tail that the summary records. `buf` is a
    /// recycled buffer to read into.
    pub fn next_block(&mut self, mut buf: Vec<u8>) -> Result<Option<Block>> {
        if self.finished {
            return Ok(None);
        }
        // `buf[..used]` is stream data; the rest of `buf` is initialized space to read into.
        let mut used = self.carry.len();
        if buf.len() < used {
            buf.resize(used, 0);
        }
        buf[..used].copy_from_slice(&self.carry);
        self.carry.clear();
        loop {
            let (end, frames) = self.whole_frames(&buf[..used])?;
            if end > 0 && (self.exhausted || end >= self.block_bytes / 2) {
                return Ok(Some(self.split(buf, used, end, frames)));
            }
            if self.exhausted {
                self.finished = true;
                buf.truncate(used);
                self.truncated(buf);
                return Ok(None);
            }
            // Grow only as data arrives: a corrupt length on a short stream allocates
            // nothing close to it. Only growth is zero-filled; a recycled buffer is not.
            let target = if used < self.block_bytes {
                self.block_bytes
            } else {
                used * 2
            };
            if buf.len() < target {
                buf.resize(target, 0);
            }
            let (got, failed) = fill(&mut self.src, &mut buf[used..target]);
            used += got;
            match failed {
                None => self.exhausted = used < target,
                Some(e) if self.summary.compressed => {
                    self.exhausted = true;
                    self.cause = Some(format!("zstd stream ended early or is corrupt: {e}"));
                }
                Some(e) => {
                    return Err(Error::io(
                        format!("read failed near byte {}", self.next_offset + used as u64),
                        e,
                    ))
                }
            }
        }
    }

    /// The length and count of the whole frames at the start of `buf`; refuses a length over
    /// the limit.
    fn whole_frames(&self, buf: &[u8]) -> Result<(usize, u64)> {
        let (mut at, mut frames) = (0usize, 0u64);
        while let Some(prefix) = buf.get(at..at + 4) {
            let len = u32::from_be_bytes([prefix[0], prefix[1], prefix[2], prefix[3]]);
            if len > self.max_frame_bytes {
                return Err(Error::data(
                    self.next_offset + at as u64,
                    "frame length",
                    format!(
                        "{len} bytes exceeds the frame limit of {} bytes (corrupt length prefix?)",
                        self.max_frame_bytes
                    ),
                ));
            }
            if buf.len() - at - 4 < len as usize {
                break;
            }
            at += 4 + len as usize;
            frames += 1;
        }
        Ok((at, frames))
    }

    fn split(&mut self, bytes: Vec<u8>, used: usize, end: usize, frames: u64) -> Block {
        self.carry.extend_from_slice(&bytes[end..used]);
        let start = self.next_offset;
        self.next_offset += end as u64;
        self.summary.bytes = self.next_offset;
        let frames_before = self.frames;
        self.frames += frames;
        Block {
            start,
            frames_before,
            bytes,
            len: end,
        }
    }

    /// The stream ended inside a frame (or a zstd source failed): the tail is the
    /// truncation.
    fn truncated(&mut self, tail: Vec<u8>) {
        if tail.is_empty() && self.cause.is_none() {
            return;
        }
        let (declared, available) = match tail.get(..4) {
            Some(p) => (
                Some(u32::from_be_bytes([p[0], p[1], p[2], p[3]])),
                tail.len() as u64 - 4,
            ),
            None => (None, tail.len() as u64),
        };
        self.summary.bytes += tail.len() as u64;
        self.summary.truncation = Some(Truncation {
            offset: self.next_offset,
            declared,
            available,
            cause: self.cause.take(),
            bytes: tail,
        });
    }

    pub fn into_summary(self) -> ReadSummary {
        self.summary
    }
}

/// The reading thread of [`fold_frames`] and [`read_ahead`]: frames `blocks` onto `work`,
/// each block read into a buffer that came back on `spare`, until the stream ends,
/// `stopping` is set, the workers are gone or, where `interruptible`, the reader's stop
/// asks. Returns the blocks sent, the error that ended the stream if one did, and whether
/// the stop asked.
fn feed(
    blocks: &mut Blocks,
    spare: &Receiver<Vec<u8>>,
    work: &Sender<(u64, Block)>,
    stopping: &AtomicBool,
    interruptible: bool,
) -> (u64, Option<Error>, bool) {
    let mut seq = 0u64;
    while let Ok(buf) = spare.recv() {
        if stopping.load(Ordering::Relaxed) {
            break;
        }
        match blocks.next_block(buf) {
            Ok(Some(block)) => {
                if work.send((seq, block)).is_err() {
                    break;
                }
                seq += 1;
                if interruptible && (blocks.stop)() {
                    return (seq, None, true);
                }
            }
            Ok(None) => break,
            Err(e) => return (seq, Some(e), false),
        }
    }
    (seq, None, false)
}

/// One block's share of a fold: the caller's value and what the block's frames were.
struct Part<T> {
    value: T,
    records: u64,
    undecodable: u64,
    examples: Vec<(u64, String)>,
    buf: Vec<u8>,
    /// The stream offset after the block.
    end: u64,
}

/// Puts the blocks' parts back in stream order.
struct InOrder<T> {
    pending: BTreeMap<u64, Part<T>>,
    next: u64,
    records: u64,
    undecodable: u64,
    examples: Vec<(u64, String)>,
    /// The merge asked to stop: later blocks are dropped unmerged.
    stopped: bool,
    /// The stream offset after the last block merged.
    end: u64,
}

impl<T> InOrder<T> {
    fn absorb(
        &mut self,
        seq: u64,
        part: Part<T>,
        merge: &mut dyn FnMut(T) -> bool,
        spare: &crossbeam_channel::Sender<Vec<u8>>,
    ) {
        self.pending.insert(seq, part);
        while !self.stopped {
            let Some(part) = self.pending.remove(&self.next) else {
                break;
            };
            self.next += 1;
            self.end = part.end;
            self.records += part.records;
            self.undecodable += part.undecodable;
            let room = KEPT_SKIP_REASONS - self.examples.len();
            self.examples.extend(part.examples.into_iter().take(room));
            self.stopped = !merge(part.value);
            // The reader may have finished already; the buffer is then simply dropped.
            let _ = spare.send(part.buf);
        }
    }
}

/// Reads every record of `reader` on `threads` worker threads: each block of frames is
/// decoded and folded into a fresh `init()` by `fold`, and `merge` hears the blocks' values
/// in stream order — so a merge that is exact gives the same result whatever the thread
/// count. Undecodable frames are skipped and counted as [`TraceReader::next_record`] does.
/// `progress` hears records and the stream offset after each block of about `block_bytes`.
pub fn fold_records<T: Send>(
    reader: TraceReader,
    threads: usize,
    block_bytes: usize,
    init: &(dyn Fn() -> T + Sync),
    fold: &(dyn Fn(&mut T, &RecordRef<'_>) + Sync),
    merge: &mut dyn FnMut(T),
    progress: &dyn Fn(u64, u64),
) -> Result<ReadSummary> {
    fold_frames(
        reader,
        threads,
        block_bytes,
        init,
        &|value, _, frame| {
            if let Frame::Record(record) = frame {
                fold(value, record);
            }
        },
        &mut |value| {
            merge(value);
            true
        },
        progress,
    )
}

/// Values a [`fold_frames`] merge is done with, for the next blocks' `init` to take again.
/// A block's output text (`dump`, `convert`) grows to megabytes, and a fresh one per block
/// grew by doubling, copied at each step into pages the kernel faulted in and cleared: a
/// third of a dump's time. It holds what was given back, as many as the blocks in flight.
pub struct Spares<T>(Mutex<Vec<T>>);

impl<T> Default for Spares<T> {
    fn default() -> Self {
        Spares(Mutex::new(Vec::new()))
    }
}

impl<T> Spares<T> {
    /// One given back, if any.
    pub fn take(&self) -> Option<T> {
        self.0.lock().ok()?.pop()
    }

    pub fn give(&self, value: T) {
        if let Ok(mut spares) = self.0.lock() {
            spares.push(value);
        }
    }
}

/// [`fold_records`] for every frame, undecodable ones included, with its index (the first
/// frame after the header is 1): for output that shows every frame (`dump`). `merge`
/// returning `false` stops the read (the reader of a closed pipe); the summary then counts
/// what was merged.
pub fn fold_frames<T: Send>(
    reader: TraceReader,
    threads: usize,
    block_bytes: usize,
    init: &(dyn Fn() -> T + Sync),
    fold: &(dyn Fn(&mut T, u64, &Frame<'_>) + Sync),
    merge: &mut dyn FnMut(T) -> bool,
    progress: &dyn Fn(u64, u64),
) -> Result<ReadSummary> {
    let threads = threads.max(1);
    let mut blocks = reader.into_blocks(block_bytes);
    let (work_tx, work_rx) = bounded::<(u64, Block)>(threads * 2);
    let (done_tx, done_rx) = unbounded::<(u64, Part<T>)>();
    let (spare_tx, spare_rx) = unbounded::<Vec<u8>>();
    // The buffers in circulation: as many as the workers and the work queue hold, and one
    // more being read.
    for _ in 0..3 * threads + 1 {
        let _ = spare_tx.send(Vec::new());
    }
    // Set when the merge asked to stop.
    let stopping = AtomicBool::new(false);
    std::thread::scope(|scope| -> Result<ReadSummary> {
        for _ in 0..threads {
            let (work_rx, done_tx) = (work_rx.clone(), done_tx.clone());
            scope.spawn(move || {
                for (seq, block) in work_rx {
                    let mut seen = Vec::new();
                    let mut part = Part {
                        value: init(),
                        records: 0,
                        undecodable: 0,
                        examples: Vec::new(),
                        buf: Vec::new(),
                        end: block.start + block.len() as u64,
                    };
                    for (i, (offset, body)) in block.frames().enumerate() {
                        let index = block.frames_before + i as u64 + 1;
                        let frame = match RecordSpans::parse_noting(body, &mut seen) {
                            Ok(spans) => {
                                part.records += 1;
                                Frame::Record(
                                    RecordRef::from_spans(offset, body, &spans).noting(&seen),
                                )
                            }
                            Err(reason) => {
                                part.undecodable += 1;
                                if part.examples.len() < KEPT_SKIP_REASONS {
                                    part.examples.push((offset, reason.clone()));
                                }
                                Frame::Undecodable {
                                    offset,
                                    body,
                                    reason,
                                }
                            }
                        };
                        fold(&mut part.value, index, &frame);
                    }
                    part.buf = block.into_buffer();
                    if done_tx.send((seq, part)).is_err() {
                        return;
                    }
                }
            });
        }
        drop((work_rx, done_tx));
        // The reading thread frames the stream into blocks while this one merges the parts
        // in order: the copy out of the page cache is no longer on the merge's thread,
        // which was the busiest. A block is read only into a buffer the merge has given
        // back, which bounds the blocks in flight, and so the parts waiting to be merged.
        let stopping = &stopping;
        let reading = scope.spawn(move || {
            let (_, failure, interrupted) = feed(&mut blocks, &spare_rx, &work_tx, stopping, true);
            (blocks, failure, interrupted)
        });
        let mut order = InOrder {
            pending: BTreeMap::new(),
            next: 0,
            records: 0,
            undecodable: 0,
            examples: Vec::new(),
            stopped: false,
            end: 0,
        };
        for (s, part) in done_rx.iter() {
            order.absorb(s, part, merge, &spare_tx);
            progress(order.records, order.end);
            if order.stopped {
                // The reading thread ends at its next block, and the workers with the
                // blocks it sent; theirs are dropped unmerged.
                stopping.store(true, Ordering::Relaxed);
                let _ = spare_tx.send(Vec::new());
            }
        }
        drop(spare_tx);
        let (blocks, failure, interrupted) = reading
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
        if let Some(e) = failure {
            return Err(e);
        }
        let mut summary = blocks.into_summary();
        summary.records += order.records;
        summary.undecodable += order.undecodable;
        summary.undecodable_examples = order.examples;
        summary.interrupted = interrupted;
        Ok(summary)
    })
}

/// One frame of a block read ahead: a record with what `prepare` made of it, or the reason
/// it could not be decoded.
enum Ahead<T> {
    Record {
        offset: u64,
        body: std::ops::Range<usize>,
        spans: RecordSpans,
        prepared: T,
    },
    Undecodable {
        offset: u64,
        reason: String,
    },
}

/// Decoding workers [`read_ahead`] uses at most. The consumer takes each record in order on
/// one thread, and replay applies a call in about half the instructions its decoding takes
/// (callgrind, `big_1x.lct`): two workers keep up with it, and many more would only hold
/// blocks in memory.
const MAX_READ_AHEAD_WORKERS: usize = 4;

/// A block of frames decoded ahead, with the worker whose allocations its values are.
struct Decoded<T> {
    block: Block,
    items: Vec<Ahead<T>>,
    worker: usize,
}

/// Reads every record of `reader` with the decoding done ahead: a reading thread frames the
/// stream into blocks, up to `workers` threads (at most four) validate each block's records
/// and run `prepare` on each with their own state from `init` (replay's call decoding),
/// while `consume` takes them in stream order on the calling thread — for a consumer that
/// must see records in order but need not parse them.
/// Undecodable frames are skipped and counted where they fall, as
/// [`TraceReader::next_record`] does. `consume` returning `Ok(false)` stops the read; what
/// was read ahead past that point is not counted, and a truncated tail is reported only when
/// the read got there. Memory is a few blocks a worker, whatever the trace's length: a
/// block is read only into a buffer the consumer has given back.
///
/// `consume` borrows each prepared value; the block's values go back to the worker that made
/// them and are dropped there, where they were allocated: glibc's allocator takes a lock for
/// every block freed by another thread than its own, and replay's key lists made that a
/// tenth of its time.
pub fn read_ahead<S, T: Send>(
    reader: TraceReader,
    block_bytes: usize,
    workers: usize,
    init: &(dyn Fn() -> S + Sync),
    prepare: &(dyn Fn(&mut S, &RecordRef<'_>) -> T + Sync),
    consume: &mut dyn FnMut(&RecordRef<'_>, &mut T) -> Result<bool>,
) -> Result<ReadSummary> {
    let workers = workers.clamp(1, MAX_READ_AHEAD_WORKERS);
    let mut blocks = reader.into_blocks(block_bytes);
    let (work_tx, work_rx) = unbounded::<(u64, Block)>();
    let (done_tx, done_rx) = unbounded::<(u64, Result<Decoded<T>>)>();
    let (spare_tx, spare_rx) = unbounded::<Vec<u8>>();
    // The buffers in circulation: the reading thread waits for one to come back before it
    // reads on, which bounds the blocks in flight.
    for _ in 0..2 * workers + 1 {
        let _ = spare_tx.send(Vec::new());
    }
    let returns: Vec<_> = (0..workers).map(|_| unbounded::<Vec<Ahead<T>>>()).collect();
    // Set when the consumer stops early: the blocks in flight are then dropped undecoded
    // (a plan's head of the trace stops after a few blocks of a long file).
    let stopped = AtomicBool::new(false);
    std::thread::scope(|scope| -> Result<ReadSummary> {
        for (worker, (_, back_rx)) in returns.iter().enumerate() {
            let (work_rx, done_tx, stopped) = (work_rx.clone(), done_tx.clone(), &stopped);
            scope.spawn(move || {
                let mut state = init();
                for (seq, block) in work_rx {
                    if stopped.load(Ordering::Relaxed) {
                        return;
                    }
                    let mut items = back_rx.try_recv().unwrap_or_default();
                    items.clear();
                    let mut seen = Vec::new();
                    for (offset, body) in block.frames() {
                        items.push(match RecordSpans::parse_noting(body, &mut seen) {
                            Ok(spans) => {
                                let record =
                                    RecordRef::from_spans(offset, body, &spans).noting(&seen);
                                let start = (offset - block.start) as usize + 4;
                                Ahead::Record {
                                    offset,
                                    body: start..start + body.len(),
                                    prepared: prepare(&mut state, &record),
                                    spans,
                                }
                            }
                            Err(reason) => Ahead::Undecodable { offset, reason },
                        });
                    }
                    let decoded = Decoded {
                        block,
                        items,
                        worker,
                    };
                    if done_tx.send((seq, Ok(decoded))).is_err() {
                        return;
                    }
                }
            });
        }
        drop(work_rx);
        let stopping = &stopped;
        let reading = scope.spawn(move || {
            let (seq, failure, _) = feed(&mut blocks, &spare_rx, &work_tx, stopping, false);
            // In its place in the stream: the consumer takes it after the blocks before it.
            if let Some(e) = failure {
                let _ = done_tx.send((seq, Err(e)));
            }
            blocks
        });
        let (mut records, mut undecodable, mut examples) = (0, 0, Vec::new());
        let mut pending = BTreeMap::new();
        let mut next = 0u64;
        // Whether the consumer took every record.
        let mut take = || -> Result<bool> {
            for (seq, decoded) in done_rx.iter() {
                pending.insert(seq, decoded);
                while let Some(decoded) = pending.remove(&next) {
                    next += 1;
                    let Decoded {
                        block,
                        mut items,
                        worker,
                    } = decoded?;
                    for item in &mut items {
                        match item {
                            Ahead::Record {
                                offset,
                                body,
                                spans,
                                prepared,
                            } => {
                                let body = block.body(body.clone());
                                let record = RecordRef::from_spans(*offset, body, spans);
                                records += 1;
                                if !consume(&record, prepared)? {
                                    return Ok(false);
                                }
                            }
                            Ahead::Undecodable { offset, reason } => {
                                undecodable += 1;
                                if examples.len() < KEPT_SKIP_REASONS {
                                    examples.push((*offset, std::mem::take(reason)));
                                }
                            }
                        }
                    }
                    // The reader or the worker may have finished already; what they would
                    // have reused is then simply dropped here.
                    let _ = spare_tx.send(block.into_buffer());
                    let _ = returns[worker].0.send(items);
                }
            }
            Ok(true)
        };
        let finished = take();
        // Closing the way back stops the reading thread at its next block; the workers end
        // with the blocks it sent, which a consumer that stopped early (or failed) leaves
        // undecoded.
        stopped.store(!matches!(finished, Ok(true)), Ordering::Relaxed);
        drop((spare_tx, done_rx, pending));
        let blocks = reading
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
        let finished = finished?;
        let mut summary = blocks.into_summary();
        summary.records += records;
        summary.undecodable += undecodable;
        summary.undecodable_examples = examples;
        if !finished {
            summary.truncation = None;
        }
        Ok(summary)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::calls::StorageCall;
    use crate::codec::ObjectKey;
    use crate::{Header, ReadOptions, TraceWriter};

    /// A storage trace of `records` `finish_write` calls of one to eight keys each, whose
    /// chunk hashes look random (so that a compressed copy spans several zstd blocks).
    fn trace(records: u64) -> Vec<u8> {
        let mix = |x: u64| {
            let x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            let x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            x ^ (x >> 31)
        };
        let mut writer = TraceWriter::new(Vec::new(), Header::storage(100.0, 1_795_297_114.0));
        writer.attach_storage_config("{}").expect("header");
        let mut args = Vec::new();
        for i in 0..records {
            let keys: Vec<ObjectKey> = (0..1 + i % 8)
                .map(|k| ObjectKey {
                    chunk_hash: (0..4)
                        .flat_map(|w| mix(i * 32 + k * 4 + w).to_le_bytes())
                        .collect(),
                    model_name: "m".into(),
                    kv_rank: 0,
                    object_group_id: 0,
                    cache_salt: String::new(),
                })
                .collect();
            let call = StorageCall::FinishWrite { keys: &keys };
            args.clear();
            call.encode_args(&mut args);
            let t = i as f64 * 0.001;
            writer
                .write_record_parts(t, 1_795_297_114.0 + t, call.qualname(), &args)
                .expect("record");
        }
        writer.finish().expect("finish")
    }

    fn reader(bytes: &[u8]) -> TraceReader {
        TraceReader::from_reader(std::io::Cursor::new(bytes.to_vec()), ReadOptions::default())
            .expect("header")
    }

    /// Record offsets and the summary, read one frame at a time.
    fn sequential(bytes: &[u8]) -> (Vec<u64>, ReadSummary) {
        let mut r = reader(bytes);
        let mut offsets = Vec::new();
        while let Some(record) = r.next_record().expect("read") {
            offsets.push(record.offset);
        }
        (offsets, r.into_summary())
    }

    /// The same through blocks of at least 4 KiB on `threads` threads.
    fn in_blocks(bytes: &[u8], threads: usize) -> (Vec<u64>, ReadSummary) {
        let mut offsets = Vec::new();
        let summary = fold_records(
            reader(bytes),
            threads,
            4096,
            &Vec::new,
            &|v: &mut Vec<u64>, r| v.push(r.offset),
            &mut |v| offsets.extend(v),
            &|_, _| {},
        )
        .expect("read");
        (offsets, summary)
    }

    /// The same read ahead on `workers` threads, `prepare` and `consume` agreeing on each.
    fn ahead(bytes: &[u8], workers: usize) -> (Vec<u64>, ReadSummary) {
        let mut offsets = Vec::new();
        let summary = read_ahead(
            reader(bytes),
            4096,
            workers,
            &|| (),
            &|_, r| r.offset,
            &mut |r, prepared| {
                assert_eq!(r.offset, *prepared);
                offsets.push(*prepared);
                Ok(true)
            },
        )
        .expect("read");
        (offsets, summary)
    }

    #[test]
    fn blocks_read_what_the_frame_reader_reads_whatever_the_threads() {
        let whole = trace(300);
        let mut corrupt = whole.clone();
        // A record frame whose body is not msgpack: skipped and counted by both.
        let second = sequential(&whole).0[1] as usize;
        corrupt[second + 4..second + 12].fill(0xc1);
        let mut files = vec![whole.clone(), corrupt];
        for cut in [
            whole.len() - 1,
            whole.len() - 300,
            whole.len() / 2 + 2,
            second + 2,
        ] {
            files.push(whole[..cut].to_vec());
        }
        let zstd = zstd::encode_all(whole.as_slice(), 3).expect("zstd");
        files.push(zstd.clone());
        // Every field of the summary compared, through its debug form.
        let shown = |(offsets, summary): (Vec<u64>, ReadSummary)| (offsets, format!("{summary:?}"));
        for bytes in &files {
            let expected = shown(sequential(bytes));
            for threads in [1, 3] {
                assert_eq!(
                    shown(in_blocks(bytes, threads)),
                    expected,
                    "{threads} threads"
                );
            }
            for workers in [1, 3] {
                assert_eq!(
                    shown(ahead(bytes, workers)),
                    expected,
                    "read ahead, {workers} workers"
                );
            }
        }
    }

    /// Records picked by offset, from a plain file and from a zstd stream, are those a
    /// sequential read finds there, body for body; an offset where no frame begins (the file
    /// changed since its offsets were taken) is an error at that byte.
    #[test]
    fn records_read_at_their_offsets_are_the_sequential_reads() {
        let whole = trace(300);
        let mut expected = Vec::new();
        let mut r = reader(&whole);
        while let Some(record) = r.next_record().expect("read") {
            expected.push((record.offset, record.t_mono, record.body.to_vec()));
        }
        let picked: Vec<_> = expected.iter().skip(1).step_by(7).cloned().collect();
        let offsets: Vec<u64> = picked.iter().map(|p| p.0).collect();
        let dir = std::env::temp_dir().join(format!("kvtrace-lmct-at-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let zstd = zstd::encode_all(whole.as_slice(), 3).expect("zstd");
        for (name, bytes) in [("plain.lct", &whole), ("zstd.lct.zst", &zstd)] {
            let path = dir.join(name);
            std::fs::write(&path, bytes).expect("write");
            let read_at = |offsets: &[u64]| {
                let mut seen = Vec::new();
                crate::reader::read_records_at(&path, ReadOptions::default(), offsets, &mut |r| {
                    seen.push((r.offset, r.t_mono, r.body.to_vec()));
                    Ok(())
                })
                .map(|()| seen)
            };
            assert_eq!(read_at(&offsets).expect(name), picked, "{name}");
            let inside = offsets[3] + 1;
            let err = read_at(&[offsets[0], inside]).expect_err("not a frame");
            assert_eq!(
                err.place,
                Some(kvtrace_io::error::Place::Byte(inside)),
                "{name}"
            );
            assert!(err.to_string().contains("did the file change"), "{err}");
            let past = whole.len() as u64 + 10;
            assert!(read_at(&[past]).is_err(), "{name}");
        }
        std::fs::remove_dir_all(&dir).expect("clean up");
    }

    /// A consumer that stops: only what it was handed is counted — not an undecodable frame
    /// or a cut tail the reading thread had already reached — and its error comes back.
    #[test]
    fn a_stopped_read_ahead_counts_only_what_it_handed_out() {
        let whole = trace(300);
        let offsets = sequential(&whole).0;
        let mut bytes = whole[..whole.len() - 1].to_vec();
        let late = offsets[200] as usize;
        bytes[late + 4..late + 12].fill(0xc1);
        for workers in [1, 3] {
            let mut seen = 0;
            let summary = read_ahead(
                reader(&bytes),
                4096,
                workers,
                &|| (),
                &|_, _| (),
                &mut |_, _| {
                    seen += 1;
                    Ok(seen < 10)
                },
            )
            .expect("read");
            assert_eq!((seen, summary.records, summary.undecodable), (10, 10, 0));
            assert!(summary.truncation.is_none());
            let err = read_ahead(
                reader(&bytes),
                4096,
                workers,
                &|| (),
                &|_, _| (),
                &mut |r, _| Err(Error::data(r.offset, "t_mono", "refused")),
            )
            .expect_err("the consumer's error");
            assert!(err.to_string().contains("refused"), "{err}");
        }
    }

    /// A zstd stream that ends early: the same records and the same frame cut, with the
    /// cause. (The frame reader may report fewer of the cut frame's bytes as present: it
    /// drops what a failing read had already decoded; blocks keep it.)
    #[test]
    fn a_cut_zstd_stream_gives_the_same_records_and_cut() {
        let zstd = zstd::encode_all(trace(300).as_slice(), 3).expect("zstd");
        let cut = &zstd[..zstd.len() - 10];
        let (offsets, _) = sequential(cut);
        let mut r = reader(cut);
        while r.next_record().expect("read").is_some() {}
        let expected = r.into_summary().truncation.expect("cut");
        let runs = [
            in_blocks(cut, 1),
            in_blocks(cut, 3),
            ahead(cut, 1),
            ahead(cut, 3),
        ];
        for (seen, summary) in runs {
            assert_eq!(seen, offsets);
            let t = summary.truncation.expect("cut");
            assert_eq!((t.offset, t.declared), (expected.offset, expected.declared));
            assert!(t.cause.is_some_and(|c| c.contains("zstd")));
        }
    }

    #[test]
    fn a_corrupt_length_is_refused_with_its_offset() {
        let mut bytes = trace(50);
        let at = bytes.len() / 2;
        let mut r = reader(&bytes);
        let mut frame = 0;
        while let Some(rec) = r.next_record().expect("read") {
            if rec.offset as usize > at {
                frame = rec.offset as usize;
                break;
            }
        }
        bytes[frame..frame + 4].copy_from_slice(&u32::MAX.to_be_bytes());
        let err = fold_records(
            reader(&bytes),
            2,
            4096,
            &|| (),
            &|_, _| {},
            &mut |_| {},
            &|_, _| {},
        )
        .expect_err("refused");
        assert!(err.to_string().contains(&format!("byte {frame}")), "{err}");
    }
}
