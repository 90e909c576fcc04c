//! The event bus: traced calls are published from any thread and handed, in publish order,
//! to subscribers on one drain thread.
//!
//! Two promises matter to users recording production traffic. When nothing records, a traced
//! call costs one relaxed atomic load ([`Tracer::is_recording`]). When something records,
//! nothing is lost silently: under the default `block` policy publishers wait for the drain
//! thread; under `drop` they never wait, and every dropped event is counted and reported in
//! the recorder's trailer.

pub mod recorder;

use std::borrow::Cow;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use crossbeam_channel::{bounded, Receiver, Sender, TrySendError};

use crate::clock;
use kvtrace_io::error::{Error, Result};

/// What a publisher does when the queue is full.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Backpressure {
    /// Wait for room: lossless.
    #[default]
    Block,
    /// Drop the event and count it: the caller never waits.
    Drop,
}

impl Backpressure {
    pub fn name(self) -> &'static str {
        match self {
            Backpressure::Block => "block",
            Backpressure::Drop => "drop",
        }
    }
}

/// One traced call, as it crosses the bus.
#[derive(Clone, Debug)]
pub struct CallEvent {
    /// Monotonic clock (seconds) sampled on the calling thread.
    pub t_mono: f64,
    /// Unix time (seconds) sampled on the calling thread.
    pub t_wall: f64,
    pub qualname: Cow<'static, str>,
    /// The `args` map, already msgpack-encoded in LMCache's shape.
    pub args: Vec<u8>,
}

/// What the bus tells subscribers when it closes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BusSummary {
    pub backpressure: Backpressure,
    /// Events dropped because the queue was full (`drop` policy) or the bus was closing.
    pub dropped: u64,
}

/// What a subscriber reports when it is finished.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SubscriberReport {
    pub name: String,
    pub events: u64,
    pub bytes: u64,
}

/// Receives every event on the drain thread.
pub trait Subscriber: Send {
    fn on_event(&mut self, event: &CallEvent) -> Result<()>;
    /// Called once, after the last event.
    fn finish(self: Box<Self>, bus: &BusSummary) -> Result<SubscriberReport>;
}

#[derive(Clone, Copy, Debug)]
pub struct BusOptions {
    /// Events the queue holds before `block` waits or `drop` drops.
    pub capacity: usize,
    pub backpressure: Backpressure,
    /// Stamp events with a simulation's clock instead of the machine's: `(t_mono, t_wall)`
    /// of virtual time zero. A simulation moves the clock with [`Tracer::set_virtual_time`],
    /// so a recorded trace carries simulated times and is the same bytes every run.
    pub virtual_origin: Option<(f64, f64)>,
}

impl Default for BusOptions {
    fn default() -> Self {
        BusOptions {
            capacity: 1 << 16,
            backpressure: Backpressure::Block,
            virtual_origin: None,
        }
    }
}

/// A simulation's clock: the origin and the current virtual second (f64 bits).
struct VirtualClock {
    origin_mono: f64,
    origin_wall: f64,
    now: AtomicU64,
}

enum Message {
    Call(CallEvent),
    Close,
}

struct Shared {
    recording: AtomicBool,
    dropped: AtomicU64,
    backpressure: Backpressure,
    tx: Option<Sender<Message>>,
    /// Argument buffers the drain thread hands back for reuse: publishers then neither
    /// allocate nor free per call, and no memory crosses threads through the allocator.
    spare: Option<Receiver<Vec<u8>>>,
    virtual_clock: Option<VirtualClock>,
}

/// Buffers kept for reuse; larger ones are freed rather than pooled.
const SPARE_BUFFERS: usize = 4096;
const SPARE_MAX_BYTES: usize = 64 << 10;

/// A cheap, cloneable handle that instrumented code holds to publish traced calls.
#[derive(Clone)]
pub struct Tracer {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for Tracer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tracer")
            .field("recording", &self.is_recording())
            .finish_non_exhaustive()
    }
}

impl Tracer {
    /// A tracer attached to no bus: `is_recording` is always false.
    pub fn disabled() -> Tracer {
        Tracer {
            shared: Arc::new(Shared {
                recording: AtomicBool::new(false),
                dropped: AtomicU64::new(0),
                backpressure: Backpressure::Block,
                tx: None,
                spare: None,
                virtual_clock: None,
            }),
        }
    }

    /// The whole cost of a traced call when nothing records.
    #[inline(always)]
    pub fn is_recording(&self) -> bool {
        self.shared.recording.load(Ordering::Relaxed)
    }

    /// Publishes a call whose arguments `encode_args` writes as a msgpack map. Does nothing
    /// (and does not run `encode_args`) when nothing records.
    #[inline(always)]
    pub fn publish_call(
        &self,
        qualname: impl Into<Cow<'static, str>>,
        encode_args: impl FnOnce(&mut Vec<u8>),
    ) {
        if !self.is_recording() {
            return;
        }
        let (t_mono, t_wall) = match &self.shared.virtual_clock {
            Some(c) => {
                let now = f64::from_bits(c.now.load(Ordering::Relaxed));
                (c.origin_mono + now, c.origin_wall + now)
            }
            None => (clock::monotonic_secs(), clock::wall_secs()),
        };
        let mut args = match self.shared.spare.as_ref().and_then(|s| s.try_recv().ok()) {
            Some(mut buf) => {
                buf.clear();
                buf
            }
            None => Vec::with_capacity(1024),
        };
        encode_args(&mut args);
        self.publish(CallEvent {
            t_mono,
            t_wall,
            qualname: qualname.into(),
            args,
        });
    }

    /// Publishes a prepared event under the bus's backpressure policy.
    pub fn publish(&self, event: CallEvent) {
        let Some(tx) = &self.shared.tx else {
            return;
        };
        let sent = match self.shared.backpressure {
            Backpressure::Block => tx.send(Message::Call(event)).is_ok(),
            Backpressure::Drop => match tx.try_send(Message::Call(event)) {
                Ok(()) => true,
                Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => false,
            },
        };
        if !sent {
            self.shared.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Moves the virtual clock of a bus started with `virtual_origin` (seconds since its
    /// origin); does nothing on a bus that follows the machine's clock.
    pub fn set_virtual_time(&self, secs: f64) {
        if let Some(c) = &self.shared.virtual_clock {
            c.now.store(secs.to_bits(), Ordering::Relaxed);
        }
    }

    /// Events dropped so far.
    pub fn dropped(&self) -> u64 {
        self.shared.dropped.load(Ordering::Relaxed)
    }
}

/// Owns the drain thread and its subscribers.
pub struct EventBus {
    tracer: Tracer,
    drain: Option<JoinHandle<Vec<Result<SubscriberReport>>>>,
}

impl EventBus {
    /// Starts the drain thread. Recording is on from here until [`EventBus::close`] when
    /// there is at least one subscriber.
    pub fn start(options: BusOptions, subscribers: Vec<Box<dyn Subscriber>>) -> Result<EventBus> {
        let (tx, rx) = bounded(options.capacity.max(1));
        let (spare_tx, spare_rx) = bounded(SPARE_BUFFERS);
        let shared = Arc::new(Shared {
            recording: AtomicBool::new(!subscribers.is_empty()),
            dropped: AtomicU64::new(0),
            backpressure: options.backpressure,
            tx: Some(tx),
            spare: Some(spare_rx),
            virtual_clock: options
                .virtual_origin
                .map(|(origin_mono, origin_wall)| VirtualClock {
                    origin_mono,
                    origin_wall,
                    now: AtomicU64::new(0f64.to_bits()),
                }),
        });
        let drain_shared = Arc::clone(&shared);
        let drain = std::thread::Builder::new()
            .name("kvtrace-event-bus".into())
            .spawn(move || drain_loop(rx, spare_tx, subscribers, &drain_shared))
            .map_err(|e| Error::io("cannot start the event-bus thread", e))?;
        Ok(EventBus {
            tracer: Tracer { shared },
            drain: Some(drain),
        })
    }

    /// A handle for publishers.
    pub fn tracer(&self) -> Tracer {
        self.tracer.clone()
    }

    /// Stops recording, delivers everything queued, and finishes every subscriber (the
    /// recorder flushes, writes its trailer and fsyncs). The first subscriber error wins.
    pub fn close(mut self) -> Result<Vec<SubscriberReport>> {
        self.tracer.shared.recording.store(false, Ordering::SeqCst);
        if let Some(tx) = &self.tracer.shared.tx {
            let _ = tx.send(Message::Close);
        }
        let results = match self.drain.take().map(JoinHandle::join) {
            Some(Ok(results)) => results,
            Some(Err(_)) => {
                return Err(Error::io(
                    "event-bus thread",
                    std::io::Error::other("panicked"),
                ))
            }
            None => Vec::new(),
        };
        results.into_iter().collect()
    }
}

impl Drop for EventBus {
    fn drop(&mut self) {
        if let Some(drain) = self.drain.take() {
            self.tracer.shared.recording.store(false, Ordering::SeqCst);
            if let Some(tx) = &self.tracer.shared.tx {
                let _ = tx.send(Message::Close);
            }
            let _ = drain.join();
        }
    }
}

fn drain_loop(
    rx: Receiver<Message>,
    spare: Sender<Vec<u8>>,
    subscribers: Vec<Box<dyn Subscriber>>,
    shared: &Shared,
) -> Vec<Result<SubscriberReport>> {
    let mut live: Vec<(Box<dyn Subscriber>, Option<Error>)> =
        subscribers.into_iter().map(|s| (s, None)).collect();
    let mut deliver = |event: CallEvent| {
        for (sub, failed) in live.iter_mut() {
            if failed.is_none() {
                if let Err(e) = sub.on_event(&event) {
                    *failed = Some(e);
                }
            }
        }
        if event.args.capacity() <= SPARE_MAX_BYTES {
            let _ = spare.try_send(event.args);
        }
    };
    while let Ok(message) = rx.recv() {
        match message {
            Message::Call(event) => deliver(event),
            Message::Close => break,
        }
    }
    while let Ok(message) = rx.try_recv() {
        if let Message::Call(event) = message {
            deliver(event);
        }
    }
    let summary = BusSummary {
        backpressure: shared.backpressure,
        dropped: shared.dropped.load(Ordering::SeqCst),
    };
    // A subscriber that failed is still finished, so that whatever it wrote before the
    // failure is flushed and synced; its first error is what gets reported.
    live.into_iter()
        .map(|(sub, failed)| {
            let finished = sub.finish(&summary);
            match failed {
                Some(e) => Err(e),
                None => finished,
            }
        })
        .collect()
}
