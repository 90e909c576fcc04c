//! Several servers' events traces as one fleet: their cache-event streams merged by wall
//! clock, and what the fleet's caches held and served over time.
//!
//! The merge is LMCache's `trace replay-events` order: every record of every file, sorted
//! stably by `t_wall` (files in the order given, records in file order at equal times), so
//! no server's own sequence is reordered and the interleaving carries the hosts' clock skew.
//!
//! Residency is rebuilt from the stream: a `store` puts an entry in its tier, a `delete`
//! takes it out, and a new incarnation or a `stop` mark empties the server's own tiers (a
//! restarted process starts cold). A tier marked `shared` is one store for the whole fleet,
//! named by tier and backend; every other tier is the server's own. An `access` is a *hit*
//! when its tier holds the key at that moment. LMCache touches keys on stores as well as on
//! reads, so an access of a key not yet stored is usually a store's own touch: the ratio is
//! the share of accesses that found the key resident, not a request hit rate.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use serde::Serialize;
use xxhash_rust::xxh3::xxh3_128;

use super::summary::{py_str, py_truth};
use crate::error::{Error, Result};
use crate::lmct::msgpack::RawValue;
use crate::lmct::{ReadOptions, TraceReader};
use crate::storage::{KeyId, KeyMap};
use kvtrace_report::units::fraction;

/// Occupancy samples a summary keeps, evenly spaced over the merged stream's wall time.
pub const OCCUPANCY_SAMPLES: usize = 20;

/// What a batch does to its tier.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventKind {
    Store,
    Access,
    Delete,
    /// Any other batch type (a capacity declaration, a type of a newer server).
    Other,
}

/// One record of the merged stream.
#[derive(Clone, Debug)]
pub struct FleetRecord {
    pub t_wall: f64,
    /// Index into [`FleetStream::instances`].
    pub instance: usize,
    /// The server incarnation the record names (a stop mark may name none).
    pub incarnation: Option<i64>,
    pub event: FleetEvent,
}

#[derive(Clone, Debug)]
pub enum FleetEvent {
    Batch {
        kind: EventKind,
        tier: String,
        /// The shared tier's backend when the batch is marked shared.
        shared: Option<String>,
        /// Each entry's key and size (0 where the event carries none).
        entries: Vec<(KeyId, u64)>,
    },
    /// A lifecycle mark: `start` or `stop`.
    Lifecycle { phase: String },
}

/// Every record of several events traces in wall-clock order.
#[derive(Clone, Debug, Default)]
pub struct FleetStream {
    pub files: Vec<String>,
    /// The storage configuration the first file's header records.
    pub sm_config_json: String,
    /// Server instances in first-appearance order.
    pub instances: Vec<String>,
    pub records: Vec<FleetRecord>,
    /// What the reads warned of (a truncated or undecodable record, a header the reader
    /// doubts), each led by its file's name when the fleet is several files.
    pub warnings: Vec<String>,
}

impl FleetStream {
    /// Reads `paths`, each an events-level trace, and merges their records.
    pub fn load(paths: &[&Path], options: ReadOptions) -> Result<FleetStream> {
        let mut stream = FleetStream::default();
        let mut ids: HashMap<String, usize> = HashMap::new();
        let mut keyed: Vec<(f64, usize, usize, FleetRecord)> = Vec::new();
        for (file, path) in paths.iter().enumerate() {
            let shown = path.display().to_string();
            let mut reader = TraceReader::open(path, options).map_err(|e| e.in_file(&shown))?;
            if reader.header().level != "events" {
                return Err(Error::data(
                    0,
                    "level",
                    format!(
                        "trace level is {:?}; a fleet is merged from \"events\" traces",
                        reader.header().level
                    ),
                )
                .in_file(&shown));
            }
            if file == 0 {
                stream.sm_config_json = reader.header().sm_config_json.clone();
            }
            let mut n = 0;
            while let Some(r) = reader.next_record().map_err(|e| e.in_file(&shown))? {
                let Some((instance, incarnation, event)) = decode(r.qualname, r.args) else {
                    continue;
                };
                let next = ids.len();
                let index = *ids.entry(instance.clone()).or_insert_with(|| {
                    stream.instances.push(instance);
                    next
                });
                keyed.push((
                    r.t_wall,
                    file,
                    n,
                    FleetRecord {
                        t_wall: r.t_wall,
                        instance: index,
                        incarnation,
                        event,
                    },
                ));
                n += 1;
            }
            let said = reader.header_warnings().into_iter();
            let said = said.chain(reader.summary().warnings());
            stream.warnings.extend(said.map(|w| match paths.len() {
                1 => w,
                _ => format!("{shown}: {w}"),
            }));
            stream.files.push(shown);
        }
        keyed.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2)));
        stream.records = keyed.into_iter().map(|k| k.3).collect();
        Ok(stream)
    }
}

/// A record's server, incarnation and event; `None` for records that are not events.
fn decode(qualname: &str, args: RawValue<'_>) -> Option<(String, Option<i64>, FleetEvent)> {
    // Fields read as the events summary reads them (Python's `str()`), so a server is named
    // alike in both blocks.
    let text = |name: &str| py_str(args.get(name), "");
    let instance = py_str(args.get("instance_id"), "?");
    let incarnation = args.get("incarnation").and_then(|v| v.as_i64());
    let event = match qualname {
        "events.lifecycle" => FleetEvent::Lifecycle {
            phase: text("phase"),
        },
        "events.batch" => {
            let kind = match text("event_type").as_str() {
                "store" => EventKind::Store,
                "access" => EventKind::Access,
                "delete" => EventKind::Delete,
                _ => EventKind::Other,
            };
            let shared = py_truth(args.get("shared"));
            let entries = args
                .get("entries")
                .and_then(|e| e.array())
                .map(|items| {
                    items
                        .map(|e| {
                            let key = e.get("key").map_or(&[][..], |k| k.bytes());
                            let size = e.get("size_bytes").and_then(|s| s.as_u64()).unwrap_or(0);
                            (KeyId(xxh3_128(key)), size)
                        })
                        .collect()
                })
                .unwrap_or_default();
            FleetEvent::Batch {
                kind,
                tier: text("tier"),
                shared: shared.then(|| text("backend")),
                entries,
            }
        }
        _ => return None,
    };
    Some((instance, incarnation, event))
}

/// Figures of one server, or of the fleet together.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct FleetTotals {
    pub batches: u64,
    pub incarnations: u64,
    pub restarts: u64,
    pub stores: u64,
    pub store_bytes_per_tier: BTreeMap<String, u64>,
    pub accesses: u64,
    /// Accesses that found their key resident in their tier.
    pub access_hits: u64,
    pub access_hit_ratio: f64,
    /// Accesses and those that found their key resident, per tier.
    pub accesses_per_tier: BTreeMap<String, u64>,
    pub access_hits_per_tier: BTreeMap<String, u64>,
    pub deletes: u64,
    /// Deletes of keys the stream had not stored (or had already deleted).
    pub deletes_not_resident: u64,
    /// The most bytes each tier held at once.
    pub peak_bytes_per_tier: BTreeMap<String, u64>,
    /// What each tier held at the end of the stream.
    pub resident_bytes_per_tier: BTreeMap<String, u64>,
    pub resident_objects_per_tier: BTreeMap<String, u64>,
}

/// The fleet's resident bytes per tier at one moment.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct OccupancySample {
    /// Seconds since the stream's first record.
    pub t_s: f64,
    pub bytes_per_tier: BTreeMap<String, u64>,
    pub objects: u64,
}

/// The merged summary of several events traces.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct FleetSummary {
    pub files: Vec<String>,
    pub records: u64,
    pub duration_s: f64,
    /// Per server, in first-appearance order.
    pub instances: Vec<(String, FleetTotals)>,
    pub fleet: FleetTotals,
    pub occupancy: Vec<OccupancySample>,
}

/// A tier's label in the fleet's tables: the tier, or `tier/backend (shared)`.
fn label(tier: &str, shared: &Option<String>) -> String {
    match shared {
        None => tier.to_owned(),
        Some(backend) => format!("{tier}/{backend} (shared)"),
    }
}

/// Which store a batch lands in: the server's own tier, or the fleet's shared one.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Owner {
    Server(usize),
    Shared,
}

#[derive(Default)]
struct Tier {
    objects: KeyMap<u64>,
    bytes: u64,
}

/// The residency the stream implies, tier by tier.
#[derive(Default)]
struct Residency {
    tiers: HashMap<(Owner, String), Tier>,
}

impl Residency {
    fn bytes_per_tier(&self, owner: Option<&Owner>) -> BTreeMap<String, u64> {
        let mut out = BTreeMap::new();
        for ((o, label), tier) in &self.tiers {
            if owner.is_none_or(|want| want == o) {
                *out.entry(label.clone()).or_default() += tier.bytes;
            }
        }
        out
    }

    fn objects_per_tier(&self, owner: Option<&Owner>) -> BTreeMap<String, u64> {
        let mut out = BTreeMap::new();
        for ((o, label), tier) in &self.tiers {
            if owner.is_none_or(|want| want == o) {
                *out.entry(label.clone()).or_default() += tier.objects.len() as u64;
            }
        }
        out
    }

    /// A server's own tiers empty: its process restarted or stopped.
    fn forget(&mut self, server: usize) {
        for ((owner, _), tier) in &mut self.tiers {
            if *owner == Owner::Server(server) {
                *tier = Tier::default();
            }
        }
    }
}

fn peak(peaks: &mut BTreeMap<String, u64>, now: &BTreeMap<String, u64>) {
    for (tier, &bytes) in now {
        let p = peaks.entry(tier.clone()).or_default();
        *p = (*p).max(bytes);
    }
}

/// Summarises a merged stream.
pub fn summarise(stream: &FleetStream) -> FleetSummary {
    let servers = stream.instances.len();
    let mut totals = vec![FleetTotals::default(); servers];
    let mut fleet = FleetTotals::default();
    let mut incarnation: Vec<Option<i64>> = vec![None; servers];
    let mut residency = Residency::default();
    let first = stream.records.first().map_or(0.0, |r| r.t_wall);
    let last = stream.records.last().map_or(0.0, |r| r.t_wall);
    let span = (last - first).max(0.0);
    let mut occupancy = Vec::new();
    let sample = |residency: &Residency, t_s: f64| OccupancySample {
        t_s,
        bytes_per_tier: residency.bytes_per_tier(None),
        objects: residency
            .tiers
            .values()
            .map(|t| t.objects.len() as u64)
            .sum(),
    };
    for record in &stream.records {
        let t = (record.t_wall - first).max(0.0);
        while occupancy.len() < OCCUPANCY_SAMPLES
            && span > 0.0
            && t >= span * occupancy.len() as f64 / OCCUPANCY_SAMPLES as f64
        {
            let at = span * occupancy.len() as f64 / OCCUPANCY_SAMPLES as f64;
            occupancy.push(sample(&residency, at));
        }
        let s = record.instance;
        if record.incarnation.is_some() && incarnation[s] != record.incarnation {
            if incarnation[s].is_some() {
                totals[s].restarts += 1;
                residency.forget(s);
            }
            incarnation[s] = record.incarnation;
            totals[s].incarnations += 1;
        }
        match &record.event {
            FleetEvent::Lifecycle { phase } => {
                if phase == "stop" {
                    residency.forget(s);
                }
            }
            FleetEvent::Batch {
                kind,
                tier,
                shared,
                entries,
            } => {
                totals[s].batches += 1;
                let name = label(tier, shared);
                let owner = if shared.is_some() {
                    Owner::Shared
                } else {
                    Owner::Server(s)
                };
                let store = residency.tiers.entry((owner, name.clone())).or_default();
                let t = &mut totals[s];
                for &(key, size) in entries {
                    match kind {
                        EventKind::Store => {
                            t.stores += 1;
                            *t.store_bytes_per_tier.entry(name.clone()).or_default() += size;
                            let old = store.objects.insert(key, size).unwrap_or(0);
                            store.bytes = store.bytes - old + size;
                        }
                        EventKind::Access => {
                            t.accesses += 1;
                            *t.accesses_per_tier.entry(name.clone()).or_default() += 1;
                            if store.objects.contains_key(&key) {
                                t.access_hits += 1;
                                *t.access_hits_per_tier.entry(name.clone()).or_default() += 1;
                            }
                        }
                        EventKind::Delete => {
                            t.deletes += 1;
                            match store.objects.remove(&key) {
                                Some(size) => store.bytes -= size,
                                None => t.deletes_not_resident += 1,
                            }
                        }
                        EventKind::Other => {}
                    }
                }
                if *kind == EventKind::Store {
                    let own = Owner::Server(s);
                    peak(
                        &mut totals[s].peak_bytes_per_tier,
                        &residency.bytes_per_tier(Some(&own)),
                    );
                    peak(
                        &mut fleet.peak_bytes_per_tier,
                        &residency.bytes_per_tier(None),
                    );
                }
            }
        }
    }
    occupancy.push(sample(&residency, span));
    for (s, t) in totals.iter_mut().enumerate() {
        let own = Owner::Server(s);
        t.resident_bytes_per_tier = residency.bytes_per_tier(Some(&own));
        t.resident_objects_per_tier = residency.objects_per_tier(Some(&own));
        t.access_hit_ratio = fraction(t.access_hits, t.accesses);
        fleet.batches += t.batches;
        fleet.incarnations += t.incarnations;
        fleet.restarts += t.restarts;
        fleet.stores += t.stores;
        for (tier, bytes) in &t.store_bytes_per_tier {
            *fleet.store_bytes_per_tier.entry(tier.clone()).or_default() += bytes;
        }
        fleet.accesses += t.accesses;
        fleet.access_hits += t.access_hits;
        for (tier, n) in &t.accesses_per_tier {
            *fleet.accesses_per_tier.entry(tier.clone()).or_default() += n;
        }
        for (tier, n) in &t.access_hits_per_tier {
            *fleet.access_hits_per_tier.entry(tier.clone()).or_default() += n;
        }
        fleet.deletes += t.deletes;
        fleet.deletes_not_resident += t.deletes_not_resident;
    }
    fleet.access_hit_ratio = fraction(fleet.access_hits, fleet.accesses);
    fleet.resident_bytes_per_tier = residency.bytes_per_tier(None);
    fleet.resident_objects_per_tier = residency.objects_per_tier(None);
    FleetSummary {
        files: stream.files.clone(),
        records: stream.records.len() as u64,
        duration_s: span,
        instances: stream.instances.iter().cloned().zip(totals).collect(),
        fleet,
        occupancy,
    }
}

impl FleetSummary {
    /// The fleet block of `kvtrace info`.
    pub fn render(&self) -> String {
        let mut s = format!(
            "Fleet: {} events traces merged by wall clock\n",
            self.files.len()
        );
        let row = |s: &mut String, key: &str, value: &dyn std::fmt::Display| {
            s.push_str(&format!("  {:<28}{value}\n", format!("{key}:")));
        };
        row(&mut s, "files", &self.files.join(", "));
        row(&mut s, "records", &self.records);
        row(&mut s, "duration", &format!("{:.3}s", self.duration_s));
        row(&mut s, "instances", &self.instances.len());
        for (id, t) in &self.instances {
            s.push_str(&format!("  {id}:\n"));
            totals(&mut s, t, 4);
        }
        s.push_str("  together:\n");
        totals(&mut s, &self.fleet, 4);
        let tiers: Vec<&String> = self
            .occupancy
            .iter()
            .flat_map(|o| o.bytes_per_tier.keys())
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect();
        s.push_str("  occupancy over time (resident bytes):\n");
        let mut head = format!("    {:>10}", "t");
        for tier in &tiers {
            head.push_str(&format!("  {tier:>14}"));
        }
        s.push_str(&format!("{head}  {:>8}\n", "objects"));
        for o in &self.occupancy {
            let mut line = format!("    {:>9.3}s", o.t_s);
            for tier in &tiers {
                let bytes = o.bytes_per_tier.get(*tier).copied().unwrap_or(0);
                line.push_str(&format!("  {bytes:>14}"));
            }
            s.push_str(&format!("{line}  {:>8}\n", o.objects));
        }
        s
    }
}

fn per_tier(map: &BTreeMap<String, u64>) -> String {
    if map.is_empty() {
        return "-".into();
    }
    map.iter()
        .map(|(t, n)| format!("{t}={n}"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn totals(s: &mut String, t: &FleetTotals, indent: usize) {
    let mut row = |key: &str, value: String| {
        s.push_str(&format!("{:indent$}{:<26}{value}\n", "", format!("{key}:")));
    };
    row(
        "incarnations",
        format!("{} (restarts {})", t.incarnations, t.restarts),
    );
    row("batches", t.batches.to_string());
    row(
        "stores",
        format!(
            "{} ({} B)",
            t.stores,
            t.store_bytes_per_tier.values().sum::<u64>()
        ),
    );
    row("store_bytes", per_tier(&t.store_bytes_per_tier));
    row(
        "accesses",
        format!(
            "{} ({} found resident, hit ratio {:.4})",
            t.accesses, t.access_hits, t.access_hit_ratio
        ),
    );
    row(
        "deletes",
        format!("{} ({} not resident)", t.deletes, t.deletes_not_resident),
    );
    row("peak_bytes", per_tier(&t.peak_bytes_per_tier));
    row(
        "resident_bytes_at_end",
        per_tier(&t.resident_bytes_per_tier),
    );
    row(
        "resident_objects_at_end",
        per_tier(&t.resident_objects_per_tier),
    );
}
