//! The events level (`lmcache server --trace-level events`) in one place: [`summary`] reads
//! one events trace into the figures `info` prints, [`fleet`] merges several servers' event
//! streams by wall clock and rebuilds what their caches held, and this module replays a fleet
//! against a tier configuration: the hit rate the fleet would have had.
//!
//! Each recorded server gets a StorageManager of the configuration (a restart, a new
//! incarnation, starts a cold one; a stop mark ends it). A `store` entry the server's
//! manager does not hold is written (`reserve_write` + `finish_write` of its recorded size);
//! an L1 `access` entry is a lookup of that key (a `full`, unlocked prefetch: an L1 hit, or an
//! L2 hit loaded into L1 at the size the key was stored with, as access entries carry none).
//! LMCache records an access for the keys a request touched, stores included, so the
//! replayed ratio compares with the recorded one (the share of accesses whose key the
//! recording held at that moment), not with a request hit rate. The recorded
//! `delete` entries are the recorded cache's evictions, and L2 `access` entries its L2
//! lookups: both are counted, not replayed, since the configured tiers evict and look up for
//! themselves. Deterministic: the same files and configuration give the same figures.

pub mod fleet;
pub mod summary;

use serde::Serialize;

use crate::error::Result;
use crate::storage::config::{BackendConfig, StorageConfig};
use crate::storage::{KeyId, KeyMap, PrefetchGroup, PrefetchRequest, StorageManager};
use fleet::{EventKind, FleetEvent, FleetStream, FleetSummary};
use kvtrace_report::units::fraction;
use kvtrace_report::{JsonStyle, Report, Table};

/// What one server (or the fleet) would have hit.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct ServerReplay {
    pub instance: String,
    /// Incarnations replayed (each a cold start).
    pub incarnations: u64,
    /// L1 access entries, each replayed as a lookup.
    pub lookups: u64,
    /// Of those, the ones whose key the recording held.
    pub recorded_hits: u64,
    pub recorded_hit_ratio: f64,
    /// Lookups the configuration served, from L1 or loaded from L2.
    pub hits: u64,
    pub l1_hits: u64,
    pub l2_hits: u64,
    pub hit_ratio: f64,
    /// Store entries in the stream, and those the configuration wrote (the rest it held
    /// already, or refused for want of room).
    pub stores: u64,
    pub stores_written: u64,
    pub stores_refused: u64,
    /// Reservations refused with OUT_OF_MEMORY (one per batch and object size).
    pub reservations_refused: u64,
    /// Recorded evictions (delete entries) and L2 accesses: counted, not replayed.
    pub recorded_deletes: u64,
    pub recorded_l2_accesses: u64,
    /// The configuration's L1 evictions and its L1 peak.
    pub evictions: u64,
    pub peak_l1_bytes: u64,
}

impl ServerReplay {
    fn add(&mut self, other: &ServerReplay) {
        self.incarnations += other.incarnations;
        self.lookups += other.lookups;
        self.recorded_hits += other.recorded_hits;
        self.hits += other.hits;
        self.l1_hits += other.l1_hits;
        self.l2_hits += other.l2_hits;
        self.stores += other.stores;
        self.stores_written += other.stores_written;
        self.stores_refused += other.stores_refused;
        self.reservations_refused += other.reservations_refused;
        self.recorded_deletes += other.recorded_deletes;
        self.recorded_l2_accesses += other.recorded_l2_accesses;
        self.evictions += other.evictions;
        self.peak_l1_bytes = self.peak_l1_bytes.max(other.peak_l1_bytes);
    }

    fn settle(&mut self) {
        self.recorded_hit_ratio = fraction(self.recorded_hits, self.lookups);
        self.hit_ratio = fraction(self.hits, self.lookups);
    }

    /// A manager's eviction and peak figures, when its incarnation ends.
    fn absorb(&mut self, sm: &StorageManager) {
        if let Some(l1) = sm.tier_stats().first() {
            self.evictions += l1.evictions;
            self.peak_l1_bytes = self.peak_l1_bytes.max(l1.peak_bytes);
        }
    }
}

/// The events replay's result.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct EventsReplayReport {
    pub files: Vec<String>,
    /// The configuration each server ran, in LMCache's JSON shape.
    pub config: serde_json::Value,
    pub records: u64,
    /// Per server, in first-appearance order; the peak of the fleet row is the largest.
    pub servers: Vec<ServerReplay>,
    pub fleet: ServerReplay,
    pub duration_s: f64,
    /// The stream's warnings ([`FleetStream::warnings`]).
    pub warnings: Vec<String>,
}

/// Server `server`'s copy of `base`: a file tier gets a directory per server, as each server
/// had its own disk (a shared Redis stays shared).
pub fn server_config(base: &StorageConfig, server: usize) -> StorageConfig {
    let mut config = base.clone();
    for tier in &mut config.l2 {
        if let BackendConfig::File { dir, .. } = &mut tier.backend {
            *dir = dir.join(format!("server-{server:05}"));
        }
    }
    config
}

/// Replays `stream`, each server on a manager of `config_for(server index)`; `recorded` is the
/// stream's own summary ([`fleet::summarise`]), whose L1 accesses the replay's
/// are set beside (a sweep summarises once for all its points).
pub fn replay_events(
    stream: &FleetStream,
    recorded: &FleetSummary,
    config_for: &dyn Fn(usize) -> StorageConfig,
) -> Result<EventsReplayReport> {
    let started = std::time::Instant::now();
    let servers = stream.instances.len();
    let mut out: Vec<ServerReplay> = stream
        .instances
        .iter()
        .map(|id| ServerReplay {
            instance: id.clone(),
            ..ServerReplay::default()
        })
        .collect();
    for (s, (_, totals)) in recorded.instances.iter().enumerate() {
        out[s].recorded_hits = totals.access_hits_per_tier.get("l1").copied().unwrap_or(0);
    }
    // Access entries carry no size: a lookup loads an object at the size it was stored with.
    let mut sizes: KeyMap<u64> = KeyMap::default();
    let mut managers: Vec<Option<(Option<i64>, StorageManager)>> =
        (0..servers).map(|_| None).collect();
    let first = stream.records.first().map_or(0.0, |r| r.t_wall);
    for record in &stream.records {
        let s = record.instance;
        let t = (record.t_wall - first).max(0.0);
        let restarted = match &managers[s] {
            Some((inc, _)) => record.incarnation.is_some() && *inc != record.incarnation,
            None => true,
        };
        if restarted {
            if let Some((_, sm)) = managers[s].take() {
                out[s].absorb(&sm);
            }
            managers[s] = Some((record.incarnation, StorageManager::new(config_for(s))?));
            out[s].incarnations += 1;
        }
        let Some((_, sm)) = managers[s].as_mut() else {
            continue;
        };
        sm.advance_to(t);
        let server = &mut out[s];
        match &record.event {
            FleetEvent::Lifecycle { phase } => {
                if phase == "stop" {
                    if let Some((_, sm)) = managers[s].take() {
                        server.absorb(&sm);
                    }
                }
            }
            FleetEvent::Batch {
                kind,
                tier,
                entries,
                ..
            } => match kind {
                EventKind::Store => {
                    sizes.extend(entries.iter().copied());
                    store(sm, server, entries);
                }
                EventKind::Access if tier == "l1" => {
                    let sized: Vec<(KeyId, u64)> = entries
                        .iter()
                        .map(|&(key, _)| (key, sizes.get(&key).copied().unwrap_or(0)))
                        .collect();
                    lookup(sm, server, &sized)?;
                }
                EventKind::Access => server.recorded_l2_accesses += entries.len() as u64,
                EventKind::Delete => server.recorded_deletes += entries.len() as u64,
                EventKind::Other => {}
            },
        }
    }
    for (s, slot) in managers.iter_mut().enumerate() {
        if let Some((_, sm)) = slot.take() {
            out[s].absorb(&sm);
        }
    }
    let mut fleet = ServerReplay {
        instance: "fleet".into(),
        ..ServerReplay::default()
    };
    for server in &mut out {
        server.settle();
        fleet.add(server);
    }
    fleet.settle();
    Ok(EventsReplayReport {
        files: stream.files.clone(),
        config: config_for(0).to_lmcache_json(),
        records: stream.records.len() as u64,
        servers: out,
        fleet,
        duration_s: started.elapsed().as_secs_f64(),
        warnings: stream.warnings.clone(),
    })
}

/// Entries grouped by object size, in first-appearance order: a reservation and a prefetch
/// group carry one size.
fn by_size(entries: &[(KeyId, u64)]) -> Vec<(u64, Vec<KeyId>)> {
    let mut groups: Vec<(u64, Vec<KeyId>)> = Vec::new();
    for &(key, size) in entries {
        match groups.iter_mut().find(|g| g.0 == size) {
            Some(g) => g.1.push(key),
            None => groups.push((size, vec![key])),
        }
    }
    groups
}

fn store(sm: &mut StorageManager, server: &mut ServerReplay, entries: &[(KeyId, u64)]) {
    server.stores += entries.len() as u64;
    let fresh: Vec<(KeyId, u64)> = entries
        .iter()
        .copied()
        .filter(|&(key, _)| !sm.is_resident(key))
        .collect();
    for (size, keys) in by_size(&fresh) {
        let reservation = sm.reserve_write(&keys, size);
        if reservation.out_of_memory {
            server.stores_refused += keys.len() as u64;
            server.reservations_refused += 1;
            continue;
        }
        // A refused L2 store is counted by its tier; the object is still in L1.
        let admitted = sm.finish_write(&reservation.reserved).unwrap_or_default();
        server.stores_written += admitted.len() as u64;
    }
}

fn lookup(
    sm: &mut StorageManager,
    server: &mut ServerReplay,
    entries: &[(KeyId, u64)],
) -> Result<()> {
    server.lookups += entries.len() as u64;
    for (size, keys) in by_size(entries) {
        let groups = [PrefetchGroup {
            keys,
            object_bytes: size,
            chunk_tokens: None,
            window: -1,
        }];
        let request = PrefetchRequest {
            groups: &groups,
            prefix_only: false,
            readers: 1,
            lock: false,
            skip_l2: false,
        };
        let outcome = sm
            .submit_prefetch(&request, "events-replay")
            .map_err(|e| crate::Error::data(0, "lookup", e.to_string()))?;
        server.hits += outcome.hit_chunks;
        server.l1_hits += outcome.l1_hit_chunks;
        server.l2_hits += outcome.l2_hit_chunks;
    }
    Ok(())
}

const COLUMNS: [&str; 15] = [
    "instance",
    "incarnations",
    "lookups",
    "recorded_hits",
    "recorded_hit_ratio",
    "hits",
    "l1_hits",
    "l2_hits",
    "hit_ratio",
    "stores",
    "stores_written",
    "stores_refused",
    "recorded_deletes",
    "evictions",
    "peak_l1_bytes",
];

impl Report for EventsReplayReport {
    fn document(&self) -> Result<serde_json::Value> {
        serde_json::to_value(self).map_err(|e| crate::Error::io("cannot encode JSON", e.into()))
    }

    fn json_style(&self) -> JsonStyle {
        JsonStyle::Pretty
    }

    fn tables(&self) -> Vec<Table> {
        let mut table = Table::new(&COLUMNS)
            .sheet("Servers")
            .csv("events_replay_servers.csv");
        let rows: Vec<serde_json::Value> = self
            .servers
            .iter()
            .chain(std::iter::once(&self.fleet))
            .filter_map(|s| serde_json::to_value(s).ok())
            .collect();
        for row in &rows {
            table.rows.push(
                COLUMNS
                    .iter()
                    .map(|c| kvtrace_report::Cell::of(&row[*c]))
                    .collect(),
            );
        }
        vec![table]
    }

    fn terminal(&self) -> String {
        let mut s = format!(
            "Events replay: {} file(s), {} server(s), {} records\n",
            self.files.len(),
            self.servers.len(),
            self.records
        );
        s.push_str(&format!(
            "  {:<38} {:>8} {:>14} {:>14} {:>8} {:>8} {:>10}\n",
            "server",
            "lookups",
            "recorded ratio",
            "replayed ratio",
            "l1 hits",
            "l2 hits",
            "evictions"
        ));
        for server in self.servers.iter().chain(std::iter::once(&self.fleet)) {
            s.push_str(&format!(
                "  {:<38} {:>8} {:>14.4} {:>14.4} {:>8} {:>8} {:>10}\n",
                server.instance,
                server.lookups,
                server.recorded_hit_ratio,
                server.hit_ratio,
                server.l1_hits,
                server.l2_hits,
                server.evictions
            ));
        }
        s
    }
}
