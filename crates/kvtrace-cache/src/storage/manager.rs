//! The StorageManager: LMCache 0.5.6's calls over L1 and the L2 tiers, on the trace's clock.
//!
//! Everything LMCache does on its own threads happens here at a defined point of trace time,
//! which is what makes a replay reproducible: the L1 eviction controller runs at `phase +
//! k × interval` (LMCache's thread sleeps a second between passes); a prefetch completes
//! inside `submit_prefetch_task` (lock pass, L2 lookup, plan, staging reservation, load,
//! settle — the controller's phases in order); the store controller's write-through happens
//! inside `finish_write`. What each call does is documented in `format-spec/REPLAY.md`.
//!
//! The manager works on key ids and publishes nothing; [`super::traced::Traced`] is the
//! facade that takes LMCache's arguments (object keys, layouts, prefetch specs), publishes
//! each call on the event bus and hands the ids here.

use std::time::Instant;

use super::config::{EvictionTiming, L2Io, Placement, PrefetchPolicy, StorageConfig, StorePolicy};
use super::l1::{Evicted, HostBuffer, L1Store, Reservation, SampleScale, L1};
use super::l2::L2;
use super::prefetch::{fold_unfold, needed, Grid};
use super::{CallError, CallStats, KeyId, KeyMap, PrefetchOutcome, TierIo, TierStats};

/// One key group of a prefetch, by id.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PrefetchGroup {
    pub keys: Vec<KeyId>,
    pub object_bytes: u64,
    pub chunk_tokens: Option<u64>,
    /// Sliding window in chunks; `<= 0` is full attention (LMCache's `-1`).
    pub window: i64,
}

/// A prefetch by key ids: what [`StorageManager::submit_prefetch`] needs of a spec.
#[derive(Clone, Copy, Debug)]
pub struct PrefetchRequest<'a> {
    pub groups: &'a [PrefetchGroup],
    /// `fetching_policy` `prefix` (true) or `full`.
    pub prefix_only: bool,
    /// Read locks per key and reader (`num_kv_readers`).
    pub readers: u64,
    /// `lock_mode` `LOCK`: the kept keys stay locked for the reader; `NO_LOCK` releases them.
    pub lock: bool,
    pub skip_l2: bool,
}

/// How a key last left L1, or why it never arrived: what explains a replayed miss.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Departure {
    /// An eviction pass (or immediate eviction) took it.
    Evicted,
    /// Its reservation failed with OUT_OF_MEMORY.
    Refused,
    /// It left without eviction: a temporary L2 load released by its reader, or `skip_l1`.
    Dropped,
}

/// The manager. Single-threaded by design: calls apply in trace order, so replays are
/// reproducible.
pub struct StorageManager {
    config: StorageConfig,
    l1: L1,
    l2: Vec<L2>,
    now: f64,
    /// Index of the next eviction pass (periodic timing).
    next_pass: u64,
    calls: CallStats,
    /// When and how each key last left L1, kept on request.
    journal: Option<KeyMap<(f64, Departure)>>,
}

impl StorageManager {
    /// Builds the tiers; fails when one cannot be set up (e.g. an unwritable directory).
    pub fn new(config: StorageConfig) -> kvtrace_io::Result<StorageManager> {
        let store = match (config.l1_gpu_bandwidth_gbps, config.l1_buffers) {
            (Some(bw), _) => L1Store::Gpu {
                bytes_per_s: bw * 1e9,
            },
            (None, true) => L1Store::Host(
                HostBuffer::map(config.l1_size_bytes, config.l1_touch_pages)
                    .map_err(|e| kvtrace_io::Error::io("L1 host buffer", e))?,
            ),
            (None, false) => L1Store::Accounting,
        };
        let l1 = L1::new(
            config.l1_size_bytes,
            config.l1_align_bytes,
            config.eviction.policy.build(),
            store,
            (config.read_ttl_s, config.write_ttl_s),
        );
        let l2 = config
            .l2
            .iter()
            .enumerate()
            .map(|(i, c)| {
                L2::new(i, c, config.l2_io)
                    .map_err(|e| kvtrace_io::Error::io(format!("L2[{i}] tier"), e))
            })
            .collect::<kvtrace_io::Result<_>>()?;
        Ok(StorageManager {
            config,
            l1,
            l2,
            now: 0.0,
            next_pass: 1,
            calls: CallStats::default(),
            journal: None,
        })
    }

    /// Makes this a replay of a sample of a trace's prefix trees: LMCache's eviction
    /// controller then acts on the L1 as on the whole trace's it stands for
    /// ([`SampleScale`]).
    pub fn sample(&mut self, scale: SampleScale) {
        self.l1.sample(scale);
    }

    /// Starts remembering when and how each key leaves L1 (one entry per key ever
    /// departed), for [`StorageManager::departure`].
    pub fn keep_journal(&mut self) {
        self.journal.get_or_insert_with(KeyMap::default);
    }

    /// Stops the journal and frees it: nothing will ask for a departure again.
    pub fn drop_journal(&mut self) {
        self.journal = None;
    }

    /// When and how a key last left L1, if the journal is kept and it did.
    pub fn departure(&self, key: KeyId) -> Option<(f64, Departure)> {
        self.journal.as_ref()?.get(&key).copied()
    }

    fn note(&mut self, keys: impl IntoIterator<Item = KeyId>, why: Departure) {
        if let Some(journal) = &mut self.journal {
            for key in keys {
                journal.insert(key, (self.now, why));
            }
        }
    }

    pub fn config(&self) -> &StorageConfig {
        &self.config
    }

    /// The manager's clock, seconds of trace time.
    pub fn now(&self) -> f64 {
        self.now
    }

    /// Moves the clock to `t` (seconds of trace time; earlier and non-finite times are
    /// ignored), running the eviction passes that fall due on the way. Passes that cannot
    /// change anything — usage below the watermark, nothing evictable before the next lock
    /// lapses — are skipped in one step, so any jump in time costs at most one pass per
    /// object evicted.
    pub fn advance_to(&mut self, t: f64) {
        if !t.is_finite() || t <= self.now {
            return;
        }
        if let EvictionTiming::Periodic {
            interval_s,
            phase_s,
        } = self.config.eviction.timing
        {
            let period = interval_s.max(1e-3);
            let due = |k: u64| phase_s + k as f64 * period;
            // Saturating: a clock of 1e19 s must neither overflow the pass count nor, where
            // f64 can no longer tell one pass from the next, run the same instant forever.
            let passes_until =
                |t: f64| (((t - phase_s) / period).floor().max(0.0) as u64).saturating_add(1);
            while due(self.next_pass) <= t {
                self.set_now(due(self.next_pass));
                let e = &self.config.eviction;
                let pass = self
                    .l1
                    .eviction_pass(e.trigger_watermark, e.eviction_ratio, self.now);
                self.calls.eviction_passes += u64::from(pass.is_some());
                let idle = match pass {
                    None => {
                        self.next_pass = passes_until(t);
                        true
                    }
                    Some(evicted) if evicted.is_empty() => {
                        let resume = self.l1.next_lapse(self.now).unwrap_or(f64::INFINITY);
                        self.next_pass = if resume <= t {
                            passes_until(resume).max(self.next_pass.saturating_add(1))
                        } else {
                            passes_until(t)
                        };
                        true
                    }
                    Some(evicted) => {
                        self.demote_all(evicted);
                        self.next_pass = self.next_pass.saturating_add(1);
                        false
                    }
                };
                if idle && due(self.next_pass) <= self.now {
                    break;
                }
            }
        }
        self.set_now(t);
    }

    /// Moves the clock, and the clock asynchronous tier calls are due by.
    fn set_now(&mut self, t: f64) {
        self.now = t;
        for tier in &mut self.l2 {
            tier.set_now(t);
        }
    }

    /// Maps the trace's clock to wall time in a paced replay: trace time `base` was due at
    /// `epoch`, and the trace runs `speedup` times faster than recorded. Asynchronous tier
    /// calls then report how late they began (schedule lag).
    pub fn pace_io(&mut self, epoch: Instant, base: f64, speedup: f64) {
        for tier in &mut self.l2 {
            tier.pace(epoch, base, speedup);
        }
    }

    /// Waits for every asynchronous tier call still queued (the drain time each tier
    /// reports); with synchronous I/O there is nothing to wait for.
    pub fn drain_io(&mut self) {
        for tier in &mut self.l2 {
            tier.drain();
        }
    }

    fn immediate(&self) -> bool {
        self.config.eviction.timing == EvictionTiming::Immediate
    }

    /// Immediate timing: evicts until `count` objects of `size` bytes fit.
    fn make_room(&mut self, size: u64, count: usize) {
        if self.immediate() && count > 0 {
            let evicted = self.l1.make_room(size, count, self.now);
            self.demote_all(evicted);
        }
    }

    /// Reserves L1 staging space for the keys that are neither resident nor staged. If the
    /// pending batch does not fit, none of it is reserved (OUT_OF_MEMORY; a sampled replay's
    /// L1 reserves the leading keys that fit, see [`SampleScale`]).
    pub fn reserve_write(&mut self, keys: &[KeyId], object_bytes: u64) -> Reservation {
        let plan = self.l1.plan_write(keys, self.now);
        self.make_room(object_bytes, plan.pending.len());
        let (r, refused) = self.l1.commit_write(plan, object_bytes, self.now);
        self.calls.keys_not_writable += r.not_writable;
        self.calls.keys_reserved += r.reserved.len() as u64;
        if r.out_of_memory {
            self.calls.out_of_memory_calls += 1;
            self.calls.out_of_memory_keys += refused.len() as u64;
            self.note(refused, Departure::Refused);
        }
        r
    }

    /// Admits staged objects as resident and stores them through to every L2 tier; returns
    /// the keys admitted.
    pub fn finish_write(&mut self, keys: &[KeyId]) -> Result<Vec<KeyId>, CallError> {
        let admitted = self.l1.finish_write(keys, self.now);
        self.calls.keys_admitted += admitted.len() as u64;
        if self.config.placement == Placement::WriteThrough && !self.l2.is_empty() {
            // Every key goes to every tier even after a refusal, so the tiers' error counts
            // say how many stores failed; the call fails with the first refusal.
            let mut first_error = None;
            let objects: Vec<(KeyId, u64)> = admitted
                .iter()
                .map(|&key| (key, self.l1.size_of(key).unwrap_or(0)))
                .collect();
            for tier in &mut self.l2 {
                if let Err(e) = tier.store_many(&objects) {
                    first_error.get_or_insert(e);
                }
            }
            if self.config.store_policy == StorePolicy::SkipL1 {
                let gone = self.l1.delete(&admitted, self.now);
                self.note(gone.into_iter().map(|e| e.key), Departure::Dropped);
            }
            if let Some(e) = first_error {
                return Err(io_error(e));
            }
        }
        Ok(admitted)
    }

    /// Runs a prefetch to completion: locks what L1 holds, looks every key up in the L2
    /// tiers, plans the hit prefix (`prefix`) or every whole hit (`full`) L1 first, reserves
    /// L1 room for the L2 part (re-planning without what did not fit), loads it, and keeps
    /// `num_kv_readers` read locks on the hit under `LOCK`.
    pub fn submit_prefetch(
        &mut self,
        request: &PrefetchRequest<'_>,
        external_request_id: &str,
    ) -> Result<PrefetchOutcome, CallError> {
        self.calls.prefetches += 1;
        let groups = request.groups;
        let rows = groups.len();
        let cols = groups.iter().map(|g| g.keys.len()).max().unwrap_or(0);
        let windows: Vec<i64> = groups.iter().map(|g| g.window).collect();
        let readers = request.readers.max(1);
        let key_at = |row: usize, col: usize| groups[row].keys.get(col).copied();
        let keys_of = |grid: &Grid| -> Vec<KeyId> {
            grid.cells().filter_map(|(r, c)| key_at(r, c)).collect()
        };
        let mut outcome = PrefetchOutcome {
            external_request_id: external_request_id.to_owned(),
            t: self.now,
            requested_chunks: groups.first().map_or(0, |g| g.keys.len() as u64),
            chunk_tokens: groups.first().and_then(|g| g.chunk_tokens),
            ..PrefetchOutcome::default()
        };
        if rows == 0 || cols == 0 {
            return Ok(outcome);
        }

        // L2 lookup: what each tier holds. First, so that a shared tier that cannot be
        // asked fails the call before it has locked anything.
        let use_l2 = !request.skip_l2 && !self.l2.is_empty();
        let mut l2_found: Vec<Grid> = Vec::new();
        if use_l2 {
            for tier in &mut self.l2 {
                let mut g = Grid::new(rows, cols);
                for (row, group) in groups.iter().enumerate() {
                    let found = tier.lookup(&group.keys).map_err(io_error)?;
                    for (col, held) in found.into_iter().enumerate() {
                        g.set(row, col, held);
                    }
                }
                l2_found.push(g);
            }
        }
        // Lock pass: read-lock every key L1 holds.
        let mut l1_locked = Grid::new(rows, cols);
        for (row, group) in groups.iter().enumerate() {
            let held = self.l1.reserve_read(&group.keys, readers, self.now);
            for (col, h) in held.into_iter().enumerate() {
                l1_locked.set(row, col, h);
            }
        }
        let (mut l1_plan, mut l2_plan) = plan(&l1_locked, &l2_found, &windows, request);
        self.release(&keys_of(&l1_locked.minus(&l1_plan)), readers);

        // Reserve L1 room for the loads, row by row; drop what does not fit and re-plan.
        let mut staged: Vec<(usize, usize, u64)> = Vec::new();
        let l2_cells = l2_plan.iter().fold(Grid::new(rows, cols), |a, g| a.or(g));
        if l2_cells.count() > 0 {
            let mut refused = false;
            for (row, group) in groups.iter().enumerate() {
                let cells: Vec<usize> = (0..cols).filter(|&c| l2_cells.get(row, c)).collect();
                let keys: Vec<KeyId> = cells.iter().filter_map(|&c| key_at(row, c)).collect();
                if keys.is_empty() {
                    continue;
                }
                self.make_room(group.object_bytes, keys.len());
                match self.l1.reserve_for_load(&keys, group.object_bytes) {
                    Some(addresses) => {
                        staged.extend(cells.iter().zip(addresses).map(|(&c, a)| (row, c, a)))
                    }
                    None => {
                        refused = true;
                        self.calls.l2_loads_out_of_memory += keys.len() as u64;
                    }
                }
            }
            if refused {
                let mut reserved = Grid::new(rows, cols);
                for &(row, col, _) in &staged {
                    reserved.set(row, col, true);
                }
                let kept: Vec<Grid> = l2_plan.iter().map(|g| g.and(&reserved)).collect();
                let (l1_again, l2_again) = plan(&l1_plan, &kept, &windows, request);
                self.release(&keys_of(&l1_plan.minus(&l1_again)), readers);
                let still = l2_again.iter().fold(Grid::new(rows, cols), |a, g| a.or(g));
                let (drop, keep): (Vec<_>, Vec<_>) =
                    staged.into_iter().partition(|&(r, c, _)| !still.get(r, c));
                self.release_staging(groups, &drop);
                staged = keep;
                (l1_plan, l2_plan) = (l1_again, l2_again);
            }
        }

        // Load each tier's cells into the staged buffers.
        let mut loaded = Grid::new(rows, cols);
        let temporary = request.lock && self.config.prefetch_policy != PrefetchPolicy::Retain;
        for (row, group) in groups.iter().enumerate() {
            let mut admit: Vec<(KeyId, u64)> = Vec::new();
            let mut failed: Vec<(usize, usize, u64)> = Vec::new();
            for &(r, col, address) in staged.iter().filter(|s| s.0 == row) {
                let key = group.keys[col];
                let tier = l2_plan.iter().position(|g| g.get(r, col));
                let hit = match tier {
                    Some(i) => self.l2[i].load(key).map_err(io_error)?,
                    None => false,
                };
                if hit {
                    admit.push((key, address));
                    loaded.set(r, col, true);
                } else {
                    failed.push((r, col, address));
                }
            }
            self.release_staging(groups, &failed);
            if !admit.is_empty() {
                self.l1
                    .admit_loaded(&admit, group.object_bytes, temporary, readers, self.now);
            }
        }

        // Settle: the hit is the prefix (or whole columns) of what is now locked in L1.
        let locked = l1_plan.or(&loaded);
        let hit = if request.prefix_only {
            fold_unfold(&locked, &windows).1.and(&locked)
        } else {
            locked.whole_columns()
        };
        let release = if request.lock {
            locked.minus(&hit)
        } else {
            locked.clone()
        };
        self.release(&keys_of(&release), readers);
        let hit_keys = keys_of(&hit);
        self.l1.touch(&hit_keys);
        if request.lock {
            outcome.held = hit_keys;
        }

        let l2_hit = hit.and(&loaded);
        outcome.hit_chunks = fold_unfold(&hit, &windows).0 as u64;
        outcome.l1_hit_chunks = fold_unfold(&hit.minus(&l2_hit), &windows).0 as u64;
        outcome.l2_hit_chunks = outcome.hit_chunks - outcome.l1_hit_chunks;
        if !request.prefix_only {
            outcome.hit_chunks = (0..cols).filter(|&c| hit.get(0, c)).count() as u64;
            outcome.l2_hit_chunks = (0..cols).filter(|&c| l2_hit.get(0, c)).count() as u64;
            outcome.l1_hit_chunks = outcome.hit_chunks - outcome.l2_hit_chunks;
        }
        Ok(outcome)
    }

    fn release(&mut self, keys: &[KeyId], readers: u64) {
        if !keys.is_empty() {
            let freed = self.l1.finish_read(keys, readers, self.now);
            self.note(freed, Departure::Dropped);
        }
    }

    fn release_staging(&mut self, groups: &[PrefetchGroup], cells: &[(usize, usize, u64)]) {
        for (row, group) in groups.iter().enumerate() {
            let mine: Vec<&(usize, usize, u64)> = cells.iter().filter(|c| c.0 == row).collect();
            if mine.is_empty() {
                continue;
            }
            let keys: Vec<KeyId> = mine.iter().map(|c| group.keys[c.1]).collect();
            let addresses: Vec<u64> = mine.iter().map(|c| c.2).collect();
            self.l1.release_loads(&keys, &addresses, group.object_bytes);
        }
    }

    /// The context entry of `read_prefetched_results`: succeeds only if every key is resident
    /// and read-locked (by a prefetch), then reads their bytes. Takes no locks. A failure is
    /// LMCache's "Failed to read prefetched object": the reader gets nothing (a miss), and
    /// the exit releases one lock of each key that was readable.
    pub fn read_prefetched_enter(&mut self, keys: &[KeyId]) -> Result<(), CallError> {
        self.l1.unsafe_read(keys, self.now).map_err(|u| {
            self.calls.read_failures += 1;
            CallError::NotReadable {
                missing: u.missing,
                unlocked: u.unlocked,
            }
        })
    }

    /// The context exit: after a failed entry, releases one read lock of each readable key;
    /// after a successful one, nothing (the caller calls `finish_read_prefetched`).
    pub fn read_prefetched_exit(&mut self, keys: &[KeyId], entered: bool) {
        if !entered {
            let readable = self.l1.readable(keys, self.now);
            self.release(&readable, 1);
        }
    }

    /// Releases `read_locks` read locks per key (LMCache clamps the count to 1..=128).
    /// Objects a prefetch loaded from L2 leave L1 with their last lock, unless the prefetch
    /// policy retains them.
    pub fn finish_read_prefetched(&mut self, keys: &[KeyId], read_locks: i64) {
        self.release(keys, read_locks.max(0) as u64);
    }

    /// LMCache's untraced `touch_l1_keys`: the server's end of a client session touches every
    /// key of the request, so the eviction policy counts it as used.
    pub fn touch_keys(&mut self, keys: &[KeyId]) {
        self.l1.touch(keys);
    }

    /// Removes objects from every tier (untraced, as in LMCache); read-locked L1 objects stay.
    pub fn delete(&mut self, keys: &[KeyId]) -> Result<(), CallError> {
        self.l1.delete(keys, self.now);
        for tier in &mut self.l2 {
            for &key in keys {
                tier.remove(key).map_err(io_error)?;
            }
        }
        Ok(())
    }

    /// Empties L1 of unlocked objects (untraced). L2 tiers keep theirs, as LMCache's
    /// `clear` does.
    pub fn clear(&mut self) {
        self.l1.clear(self.now);
    }

    /// Whether any L2 tier is configured.
    pub fn has_l2(&self) -> bool {
        !self.l2.is_empty()
    }

    /// Whether a key is resident in L1 and read-locked.
    pub fn holds_read_lock(&self, key: KeyId) -> bool {
        !self.l1.readable(&[key], self.now).is_empty()
    }

    /// Whether an object is resident in L1 (for tests and engines).
    pub fn is_resident(&self, key: KeyId) -> bool {
        self.l1.is_resident(key)
    }

    pub fn call_stats(&self) -> CallStats {
        let mut calls = self.calls.clone();
        let locks = &self.l1.locks;
        calls.read_locks_expired = locks.read_locks_expired;
        calls.write_reservations_expired = locks.write_reservations_expired;
        calls.keys_not_staged = locks.keys_not_staged;
        calls
    }

    /// Time each L2 tier spent in its backend, preceded by L1's modelled transfer time when
    /// L1 is a GPU budget (host memory copies are not timed).
    pub fn tier_io(&self) -> Vec<TierIo> {
        let l1 = self.config.l1_gpu_bandwidth_gbps.map(|_| {
            let [w, r] = self.l1.modelled;
            TierIo::of(&self.l1.stats, w, r, "modelled", None)
        });
        let l2 = self.l2.iter().map(|t| {
            let (w, r) = t.io_seconds();
            let queue = match self.config.l2_io {
                L2Io::Asynchronous { depth, workers } => Some((depth, workers)),
                L2Io::Synchronous => None,
            };
            let mut io = TierIo::of(&t.stats, w, r, self.config.l2_io.name(), queue);
            io.calls = t.queue_figures();
            io
        });
        l1.into_iter().chain(l2).collect()
    }

    /// Objects and bytes written to the L2 tiers so far, all tiers together: cheap enough to
    /// read after every call (a simulated link charges the writes a call caused).
    pub fn l2_written(&self) -> (u64, u64) {
        self.l2.iter().fold((0, 0), |(n, b), t| {
            (n + t.stats.writes, b + t.stats.bytes_written)
        })
    }

    /// Counters of every tier, L1 first.
    pub fn tier_stats(&self) -> Vec<TierStats> {
        std::iter::once(self.l1.tier_stats())
            .chain(self.l2.iter().map(L2::tier_stats))
            .collect()
    }

    /// Notes what L1 evicted and, in a waterfall, moves it down the hierarchy (nothing to
    /// move in write-through placement, where L2 already has every admitted object).
    fn demote_all(&mut self, evicted: Vec<Evicted>) {
        self.note(evicted.iter().map(|e| e.key), Departure::Evicted);
        if self.config.placement != Placement::Waterfall {
            return;
        }
        for e in evicted {
            self.l1.count_read(e.size);
            self.demote(0, e.key, e.size);
        }
    }

    /// Waterfall: places an object evicted from the tier above into L2 tier `index`, making
    /// room by moving that tier's least recently used objects further down; past the last
    /// tier the object is dropped. Single-threaded, so no object is ever lost to a race.
    fn demote(&mut self, index: usize, key: KeyId, size: u64) {
        let last = self.l2.len().saturating_sub(1);
        let Some(tier) = self.l2.get(index) else {
            self.calls.dropped_from_last_tier += 1;
            return;
        };
        if tier.holds(key) {
            return;
        }
        let cap = tier.capacity.unwrap_or(u64::MAX);
        if index < last && size as f64 > 0.95 * cap as f64 {
            return self.demote(index + 1, key, size);
        }
        let target = if index < last {
            (0.8 * cap as f64) as u64
        } else {
            cap
        };
        loop {
            let tier = &mut self.l2[index];
            if tier.used.saturating_add(size) <= target {
                break;
            }
            let Ok(Some((victim, victim_size))) = tier.drop_victim() else {
                break;
            };
            match tier.move_out(victim, victim_size) {
                Ok(()) => self.demote(index + 1, victim, victim_size),
                Err(_) => self.calls.demotion_errors += 1,
            }
        }
        let tier = &mut self.l2[index];
        if tier.used.saturating_add(size) > cap {
            self.calls.dropped_from_last_tier += u64::from(index == last);
            return;
        }
        match tier.admit(key, size) {
            Ok(()) => self.calls.demotions += 1,
            Err(_) => self.calls.demotion_errors += 1,
        }
    }
}

fn io_error(e: std::io::Error) -> CallError {
    CallError::Io(e.to_string())
}

/// LMCache's default prefetch plan: the cells needed (prefix fold or whole hits over what L1
/// holds locked and what the L2 tiers hold), served from L1 where it holds them and from the
/// first L2 tier holding each of the rest.
fn plan(
    l1_locked: &Grid,
    l2_found: &[Grid],
    windows: &[i64],
    request: &PrefetchRequest<'_>,
) -> (Grid, Vec<Grid>) {
    let found = l2_found.iter().fold(l1_locked.clone(), |a, g| a.or(g));
    let needed = needed(&found, windows, request.prefix_only);
    let l1_plan = needed.and(l1_locked);
    let mut remaining = needed.minus(&l1_plan);
    let mut l2_plan = Vec::with_capacity(l2_found.len());
    for g in l2_found {
        let mine = remaining.and(g);
        remaining = remaining.minus(&mine);
        l2_plan.push(mine);
    }
    (l1_plan, l2_plan)
}
