//! The recorder: an event-bus subscriber that writes every traced call to an LMCT file
//! LMCache 0.5.6 accepts, and closes it with a trailer that states how many records were
//! written and how many were dropped, so a lossy recording can never pass for a complete one.

use std::path::Path;

use super::{BusSummary, CallEvent, Subscriber, SubscriberReport};
use crate::clock;
use kvtrace_io::error::{Error, Result};
use kvtrace_lmct::calls::{RECORDER_META, RECORDER_SUMMARY};
use kvtrace_lmct::msgpack;
use kvtrace_lmct::value::Value;
use kvtrace_lmct::{Header, TraceSink, TraceWriter};

#[derive(Clone, Debug, Default)]
pub struct RecorderOptions {
    /// Leave out the `kvtrace.recorder.summary` trailer and the header's promise of it, for
    /// byte-for-byte LMCache output.
    pub lmcache_strict: bool,
    /// Compress the file with zstd at this level.
    pub zstd_level: Option<i32>,
}

pub struct Recorder {
    writer: TraceWriter<TraceSink>,
    path: String,
    options: RecorderOptions,
    /// Time of the last record, so the trailer never goes back in time on a virtual clock.
    last_t_mono: f64,
}

impl Recorder {
    /// Creates (truncates) the trace file. As in LMCache, record times count from now, and
    /// the header waits for [`Recorder::attach_storage_config`] or the first record.
    pub fn create(path: &Path, options: RecorderOptions) -> Result<Recorder> {
        let shown = path.display().to_string();
        let sink = TraceSink::create(path, options.zstd_level).map_err(|e| e.in_file(&shown))?;
        let mut header = Header::storage(clock::monotonic_secs(), clock::wall_secs());
        if !options.lmcache_strict {
            header.level_meta = Some(Value::Map(
                vec![(
                    Value::str(RECORDER_META),
                    Value::str(env!("CARGO_PKG_VERSION")),
                )],
                None,
            ));
        }
        Ok(Recorder {
            writer: TraceWriter::new(sink, header),
            path: shown,
            options,
            last_t_mono: 0.0,
        })
    }

    /// `(t_mono, t_wall)` of the header: the origin a virtual-clock bus stamps from.
    pub fn origin(&self) -> (f64, f64) {
        let h = self.writer.header();
        (h.t_mono_start, h.t_wall_start)
    }

    fn io(&self, what: &str, e: std::io::Error) -> Error {
        Error::io(what, e).in_file(&self.path)
    }

    /// Stores the config text and its digest in the header and writes the header.
    pub fn attach_storage_config(&mut self, config_json: &str) -> Result<()> {
        self.writer
            .attach_storage_config(config_json)
            .map_err(|e| self.io("cannot write the header", e))
    }

    /// Like [`Recorder::attach_storage_config`], serialising the value as Python's
    /// `json.dumps(sort_keys=True)` would.
    pub fn attach_storage_config_value(&mut self, config: &serde_json::Value) -> Result<()> {
        self.attach_storage_config(&kvtrace_lmct::digest::python_json(config))
    }

    fn since_start(&self, t_mono: f64) -> f64 {
        (t_mono - self.writer.header().t_mono_start).max(0.0)
    }
}

impl Subscriber for Recorder {
    fn on_event(&mut self, event: &CallEvent) -> Result<()> {
        let t_mono = self.since_start(event.t_mono);
        self.last_t_mono = self.last_t_mono.max(t_mono);
        self.writer
            .write_record_parts(t_mono, event.t_wall, &event.qualname, &event.args)
            .map_err(|e| self.io("cannot write a record", e))
    }

    fn finish(mut self: Box<Self>, bus: &BusSummary) -> Result<SubscriberReport> {
        let events = self.writer.records();
        if !self.options.lmcache_strict {
            let mut args = Vec::new();
            msgpack::put_map_len(&mut args, 4);
            msgpack::put_str(&mut args, "records");
            msgpack::put_uint(&mut args, events);
            msgpack::put_str(&mut args, "dropped");
            msgpack::put_uint(&mut args, bus.dropped);
            msgpack::put_str(&mut args, "backpressure");
            msgpack::put_str(&mut args, bus.backpressure.name());
            msgpack::put_str(&mut args, "kvtrace_version");
            msgpack::put_str(&mut args, env!("CARGO_PKG_VERSION"));
            let t_mono = self
                .since_start(clock::monotonic_secs())
                .max(self.last_t_mono);
            let t_wall = self.writer.header().t_wall_start + t_mono;
            self.writer
                .write_record_parts(t_mono, t_wall, RECORDER_SUMMARY, &args)
                .map_err(|e| self.io("cannot write the trailer", e))?;
        }
        let path = self.path.clone();
        let sink = self
            .writer
            .finish()
            .map_err(|e| Error::io("cannot flush", e).in_file(&path))?;
        sink.finish()
            .map_err(|e| Error::io("cannot flush and fsync", e).in_file(&path))?;
        let bytes = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
        Ok(SubscriberReport {
            name: format!("recorder {path}"),
            events,
            bytes,
        })
    }
}

/// Starts recording to an LMCT file (a name ending in .zst is compressed) whose header
/// carries `config`. With `virtual_clock`, records are stamped with the time the caller
/// sets on the tracer ([`super::Tracer::set_virtual_time`]) instead of the machine's.
pub fn start_recording(
    path: &Path,
    config: &crate::storage::config::StorageConfig,
    virtual_clock: bool,
) -> Result<super::EventBus> {
    use super::{BusOptions, EventBus};
    let zstd = path.to_string_lossy().ends_with(".zst");
    let options = RecorderOptions {
        zstd_level: zstd.then_some(3),
        ..RecorderOptions::default()
    };
    let mut recorder = Recorder::create(path, options)?;
    recorder.attach_storage_config_value(&config.to_lmcache_json())?;
    let bus_options = BusOptions {
        virtual_origin: virtual_clock.then(|| recorder.origin()),
        ..BusOptions::default()
    };
    EventBus::start(bus_options, vec![Box::new(recorder)])
}
