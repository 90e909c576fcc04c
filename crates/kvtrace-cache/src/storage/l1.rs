//! The L1 pool, with LMCache 0.5.6's `L1Manager` state machine (`l1_manager.py`): a write
//! reserves a *staging* object, invisible to readers, that `finish_write` admits as resident
//! (or discards when the key became resident meanwhile); readers take counted read locks;
//! both locks are TTL locks (`TTLLock`: a lock refreshes the deadline and restarts the count
//! once it lapsed, and a lapsed lock is not held). Memory comes from a first-fit
//! [`Arena`](super::arena::Arena) and the eviction policy hears every reservation, admission,
//! touch and removal as LMCache's listener does.
//!
//! Time is passed in (trace seconds), so every lock and deadline is reproducible.

use std::io;

use super::arena::Arena;
use super::eviction::{victim_count, EvictionPolicy};
use super::{KeyId, KeyMap, KeySet, TierStats};

/// LMCache's `MAX_READ_LOCK_COUNT`: read-lock counts per call are clamped to 1..=128.
const MAX_READ_LOCKS: u64 = 128;

/// A counted lock with a time to live.
#[derive(Clone, Copy, Debug, Default)]
struct TtlLock {
    count: u64,
    deadline: f64,
}

impl TtlLock {
    fn held(&self, now: f64) -> bool {
        self.count > 0 && now < self.deadline
    }

    /// Forgets a count whose deadline passed; true when there was one (a lapse).
    fn lapse(&mut self, now: f64) -> bool {
        let lapsed = self.count > 0 && now >= self.deadline;
        if lapsed {
            self.count = 0;
        }
        lapsed
    }

    /// Takes `n` locks; a lapsed lock starts counting again. True when a held count lapsed.
    fn lock(&mut self, n: u64, now: f64, ttl: f64) -> bool {
        let lapsed = self.lapse(now);
        self.count += n;
        self.deadline = now + ttl;
        lapsed
    }

    fn unlock(&mut self, n: u64) {
        self.count = self.count.saturating_sub(n);
    }
}

/// Sizes are the objects' own bytes; the arena rounds them to its alignment.
#[derive(Debug)]
struct Resident {
    address: u64,
    size: u64,
    read_lock: TtlLock,
    /// Loaded from L2 for one reader: deleted once its read locks are released.
    temporary: bool,
}

#[derive(Debug)]
struct Staged {
    address: u64,
    size: u64,
    write_lock: TtlLock,
}

/// Where L1's bytes live.
pub(super) enum L1Store {
    /// A real host pool the size of the heap, as the server's pinned pool: the first object
    /// placed at an address touches its pages, so the replay holds as much resident memory
    /// as the server's pool did. No KV bytes are copied: a storage trace carries none, and
    /// LMCache's own replay copies none either.
    Host(HostBuffer),
    /// Sizes only, for traces bigger than RAM.
    Accounting,
    /// A GPU memory budget: no bytes, `size / bandwidth` per transfer.
    Gpu { bytes_per_s: f64 },
}

impl L1Store {
    fn name(&self) -> &'static str {
        match self {
            L1Store::Host(buf) if buf.touch => "memory (pages touched)",
            L1Store::Host(_) => "memory",
            L1Store::Accounting => "memory (accounting only)",
            L1Store::Gpu { .. } => "gpu (budget)",
        }
    }

    fn modelled_seconds(&self, size: u64) -> f64 {
        match self {
            L1Store::Gpu { bytes_per_s } => size as f64 / bytes_per_s,
            _ => 0.0,
        }
    }
}

/// An anonymous private mapping: zero pages are only materialised when touched, so an 8 GiB
/// L1 costs memory in proportion to what the replay stores, and a mapping the system cannot
/// give is an error instead of an abort. Objects are placed at their arena addresses in it;
/// their pages are written only when asked (`touch`), because the kernel's zeroing of each
/// new page is then most of a replay's time (0.3 s for 2 GiB here) and LMCache's own replay
/// never writes its pool.
pub(super) struct HostBuffer {
    ptr: *mut u8,
    len: usize,
    touch: bool,
    /// Every page below this address has been touched. First fit hands out the lowest free
    /// addresses, so everything below it was part of an object once.
    touched: usize,
}

/// The page size the pool is touched at.
const PAGE: usize = 4096;

// SAFETY: the mapping is owned by exactly one L1 and only touched through `&mut self`.
unsafe impl Send for HostBuffer {}

impl HostBuffer {
    pub(super) fn map(len: u64, touch: bool) -> io::Result<HostBuffer> {
        let len = usize::try_from(len.max(1)).map_err(io::Error::other)?;
        // SAFETY: an anonymous, private, read-write mapping; the result is checked.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        // Huge pages where the kernel offers them: a 2 GiB pool becomes resident in a
        // thousand faults rather than half a million. Advice only; failure changes nothing.
        // SAFETY: advises on the mapping just created.
        unsafe {
            libc::madvise(ptr, len, libc::MADV_HUGEPAGE);
        }
        Ok(HostBuffer {
            ptr: ptr.cast(),
            len,
            touch,
            touched: 0,
        })
    }

    fn range(&mut self, address: u64, size: u64) -> &mut [u8] {
        let start = (address as usize).min(self.len);
        let end = (start + size as usize).min(self.len);
        // SAFETY: start..end lies inside the mapping, which lives as long as `self`.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(start), end - start) }
    }

    /// Makes an object's pages resident when the buffer touches pages: writes one byte in
    /// each page not touched before.
    fn place(&mut self, address: u64, size: u64) {
        if !self.touch {
            return;
        }
        let end = (address.saturating_add(size) as usize).min(self.len);
        let start = (address as usize).max(self.touched);
        if start < end {
            for byte in self
                .range(start as u64, (end - start) as u64)
                .iter_mut()
                .step_by(PAGE)
            {
                *byte = 0xA5;
            }
            self.touched = end;
        }
    }
}

impl Drop for HostBuffer {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping `map` created.
        unsafe {
            libc::munmap(self.ptr.cast(), self.len);
        }
    }
}

/// What `reserve_write` did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Reservation {
    /// Keys now staged for this writer, in LMCache's order (handed-over lapsed reservations
    /// first, then new allocations).
    pub reserved: Vec<KeyId>,
    /// Resident, already staged by this writer, or repeated in the call (KEY_NOT_WRITABLE).
    pub not_writable: u64,
    /// The pending batch did not fit: none of it was reserved.
    pub out_of_memory: bool,
}

/// A `reserve_write` between its check and its allocation (see [`L1::plan_write`]).
#[derive(Debug, Default)]
pub(super) struct WritePlan {
    reservation: Reservation,
    /// Keys that need new memory, each once, in call order.
    pub pending: Vec<KeyId>,
}

/// Why a read of prefetched objects failed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Unreadable {
    /// Not resident (KEY_NOT_EXIST).
    pub missing: u64,
    /// Resident but not read-locked (KEY_NOT_READABLE).
    pub unlocked: u64,
}

/// Lock and lifecycle counters of L1.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct LockStats {
    pub read_locks_expired: u64,
    pub write_reservations_expired: u64,
    /// `finish_write` keys with no reservation, or whose reservation lapsed.
    pub keys_not_staged: u64,
    /// `finish_read` keys that were missing or not read-locked.
    pub unlocks_of_unlocked: u64,
}

pub(super) struct L1 {
    arena: Arena,
    resident: KeyMap<Resident>,
    staging: KeyMap<Staged>,
    pub policy: Box<dyn EvictionPolicy>,
    store: L1Store,
    read_ttl: f64,
    write_ttl: f64,
    pub stats: TierStats,
    pub locks: LockStats,
    /// Modelled transfer seconds (write, read) of a GPU budget.
    pub modelled: [f64; 2],
    /// The keys of the call [`L1::plan_write`] is planning, kept between calls so that a
    /// call allocates no set of its own.
    planned: KeySet,
    /// Set when this L1 is a sampled replay's: its passes act as the whole trace's would.
    sample: Option<SampleScale>,
    /// The fraction of a victim a sampled pass owed and did not evict (see
    /// [`L1::eviction_pass`]).
    victims_owed: f64,
}

/// How a replay of a sample of a trace's prefix trees stands for the whole trace: its L1
/// holds the trunk (the keys every sample keeps whole) at full size and a `share` of
/// everything else. LMCache's controller compares the usage with its watermark and evicts a
/// ratio of the objects it tracks, trunk included, so a scaled L1 left to count its own would
/// evict too many at each pass: with 10 trunk objects beside 42 others (4 GiB of the
/// Mooncake twin at 1 %), 10 a pass where the whole trace's share is 8.4.
///
/// A sampled write stands for a hundred (at 1 %) that reach the whole trace's L1 about
/// then; where the room is a share of one write, the whole trace's L1 took that share of
/// them and refused the rest. So a sampled L1 that has room for only some of a write's
/// chunks keeps the leading ones, which its next lookup extends, instead of refusing them
/// all: it fills when the whole trace's does. Refusing them all, it kept only the writes
/// smaller than the room a pass made (those whose prefix hit); keeping the leading chunks
/// took the twin's mean error under the controller from 0.64 to 0.54 pp.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SampleScale {
    pub trunk_objects: u64,
    pub trunk_bytes: u64,
    /// The share of the keys outside the trunk the sample holds, in (0, 1].
    pub share: f64,
}

impl SampleScale {
    /// The whole trace's bytes a sample's `bytes` stand for (below the trunk's bytes, the
    /// same): an L1's usage and heap here, a sampled size in the planner.
    pub fn whole_bytes(&self, bytes: f64) -> f64 {
        let trunk = self.trunk_bytes as f64;
        match bytes > trunk && self.share > 0.0 {
            true => trunk + (bytes - trunk) / self.share,
            false => bytes,
        }
    }

    /// The victims a sampled pass owes when its L1 tracks `tracked` objects: the sample's
    /// share of what the whole trace's pass evicts (`ratio` of the trunk plus the rest
    /// unscaled), all of it outside the trunk, which a recency or frequency policy keeps
    /// (FIFO does not: there it is an approximation).
    fn victims(&self, tracked: usize, ratio: f64) -> f64 {
        let trunk = self.trunk_objects as f64;
        ratio.clamp(0.0, 1.0) * (tracked as f64 - trunk * (1.0 - self.share)).max(0.0)
    }
}

/// An object that left L1 by eviction, for a waterfall to move down.
pub(super) struct Evicted {
    pub key: KeyId,
    pub size: u64,
}

/// LMCache's `is_key_evictable`: resident and not read-locked, or staged with a lapsed write
/// lock.
fn evictable(resident: &KeyMap<Resident>, staging: &KeyMap<Staged>, key: KeyId, now: f64) -> bool {
    match resident.get(&key) {
        Some(r) if !r.read_lock.held(now) => true,
        _ => staging.get(&key).is_some_and(|s| !s.write_lock.held(now)),
    }
}

impl L1 {
    pub(super) fn new(
        heap: u64,
        align: u64,
        policy: Box<dyn EvictionPolicy>,
        store: L1Store,
        ttls: (f64, f64),
    ) -> L1 {
        let stats = TierStats {
            name: "L1".into(),
            backend: store.name().into(),
            capacity_bytes: Some(heap),
            ..TierStats::default()
        };
        L1 {
            arena: Arena::new(heap, align),
            resident: KeyMap::default(),
            staging: KeyMap::default(),
            policy,
            store,
            read_ttl: ttls.0,
            write_ttl: ttls.1,
            stats,
            locks: LockStats::default(),
            modelled: [0.0; 2],
            planned: KeySet::default(),
            sample: None,
            victims_owed: 0.0,
        }
    }

    /// Makes this L1 a sampled replay's (see [`SampleScale`]).
    pub(super) fn sample(&mut self, scale: SampleScale) {
        self.sample = Some(scale);
    }

    pub(super) fn usage(&self) -> f64 {
        if self.arena.heap() == 0 {
            0.0
        } else {
            self.arena.used() as f64 / self.arena.heap() as f64
        }
    }

    pub(super) fn is_resident(&self, key: KeyId) -> bool {
        self.resident.contains_key(&key)
    }

    fn write_bytes(&mut self, address: u64, size: u64) {
        if let L1Store::Host(buf) = &mut self.store {
            buf.place(address, size);
        }
        self.modelled[0] += self.store.modelled_seconds(size);
        self.stats.writes += 1;
        self.stats.bytes_written += size;
    }

    /// Counts a read of an object, as a load into the engine.
    pub(super) fn read_bytes(&mut self, key: KeyId) {
        if let Some(size) = self.resident.get(&key).map(|r| r.size) {
            self.count_read(size);
        }
    }

    /// Counts a read of `size` bytes (a load, or the copy out of an object being demoted).
    pub(super) fn count_read(&mut self, size: u64) {
        self.modelled[1] += self.store.modelled_seconds(size);
        self.stats.reads += 1;
        self.stats.bytes_read += size;
    }

    fn note_peak(&mut self) {
        self.stats.peak_bytes = self.stats.peak_bytes.max(self.arena.used());
    }

    /// The first half of LMCache's `reserve_write`, before any memory is allocated: keys
    /// resident, staged by a live writer or repeated in the call are not writable; a lapsed
    /// reservation is handed to this writer; the rest need new memory. Immediate eviction
    /// makes room between the halves, so a key found resident here stays not writable even
    /// if that eviction takes it, as in LMCache, where the check precedes the allocation.
    pub(super) fn plan_write(&mut self, keys: &[KeyId], now: f64) -> WritePlan {
        let mut plan = WritePlan::default();
        // Sized for the call at once: grown a key at a time, the list was reallocated four
        // times a reservation, a twentieth of a sweep.
        plan.pending.reserve(keys.len());
        let seen = &mut self.planned;
        seen.clear();
        for &key in keys {
            if self.resident.contains_key(&key) || !seen.insert(key) {
                plan.reservation.not_writable += 1;
                continue;
            }
            match self.staging.get_mut(&key) {
                Some(s) if s.write_lock.held(now) => plan.reservation.not_writable += 1,
                Some(s) => {
                    // The previous reservation lapsed: its buffer goes to the new writer.
                    s.write_lock.lock(1, now, self.write_ttl);
                    self.locks.write_reservations_expired += 1;
                    plan.reservation.reserved.push(key);
                }
                None => plan.pending.push(key),
            }
        }
        plan
    }

    /// The second half: allocates the pending keys all or nothing (OUT_OF_MEMORY; a sampled
    /// L1 the leading keys that fit) and tells the policy what was reserved. Returns the
    /// reservation and the keys it refused (none unless OUT_OF_MEMORY).
    pub(super) fn commit_write(
        &mut self,
        plan: WritePlan,
        size: u64,
        now: f64,
    ) -> (Reservation, Vec<KeyId>) {
        let WritePlan {
            reservation: mut out,
            mut pending,
        } = plan;
        let mut refused = Vec::new();
        if !pending.is_empty() {
            let mut allocated = self.arena.allocate(size, pending.len());
            if allocated.is_none() && self.sample.is_some() {
                // A sampled call stands for many of the whole trace's (see [`SampleScale`]).
                let fit = self.arena.fitting(size, pending.len());
                if fit > 0 {
                    out.out_of_memory = true;
                    refused = pending.split_off(fit);
                    allocated = self.arena.allocate(size, fit);
                }
            }
            match allocated {
                None => {
                    out.out_of_memory = true;
                    refused.append(&mut pending);
                }
                Some(addresses) => {
                    out.reserved.reserve(pending.len());
                    for (key, address) in pending.into_iter().zip(addresses) {
                        let mut write_lock = TtlLock::default();
                        write_lock.lock(1, now, self.write_ttl);
                        self.staging.insert(
                            key,
                            Staged {
                                address,
                                size,
                                write_lock,
                            },
                        );
                        out.reserved.push(key);
                    }
                    self.note_peak();
                }
            }
        }
        if !out.reserved.is_empty() {
            self.policy.on_reserved(&out.reserved);
        }
        (out, refused)
    }

    /// LMCache's `finish_write`: admits this writer's live reservations (discarding one whose
    /// key became resident meanwhile) and returns the keys that became resident.
    pub(super) fn finish_write(&mut self, keys: &[KeyId], now: f64) -> Vec<KeyId> {
        let mut admitted = Vec::with_capacity(keys.len());
        for &key in keys {
            match self.staging.get(&key) {
                Some(s) if s.write_lock.held(now) => {}
                _ => {
                    self.locks.keys_not_staged += 1;
                    continue;
                }
            }
            let Some(staged) = self.staging.remove(&key) else {
                continue;
            };
            if self.resident.contains_key(&key) {
                self.arena.free(staged.address, staged.size);
                continue;
            }
            self.write_bytes(staged.address, staged.size);
            self.resident.insert(
                key,
                Resident {
                    address: staged.address,
                    size: staged.size,
                    read_lock: TtlLock::default(),
                    temporary: false,
                },
            );
            admitted.push(key);
        }
        if !admitted.is_empty() {
            self.policy.on_created(&admitted);
        }
        admitted
    }

    /// Size of a resident object.
    pub(super) fn size_of(&self, key: KeyId) -> Option<u64> {
        self.resident.get(&key).map(|r| r.size)
    }

    /// LMCache's `reserve_read`: takes `n` read locks on each resident key; true per key that
    /// is resident.
    pub(super) fn reserve_read(&mut self, keys: &[KeyId], n: u64, now: f64) -> Vec<bool> {
        let n = n.clamp(1, MAX_READ_LOCKS);
        keys.iter()
            .map(|key| match self.resident.get_mut(key) {
                Some(r) => {
                    if r.read_lock.lock(n, now, self.read_ttl) {
                        self.locks.read_locks_expired += 1;
                    }
                    true
                }
                None => false,
            })
            .collect()
    }

    /// LMCache's `unsafe_read` of every key: Ok when all are resident and read-locked (and
    /// then their bytes are copied out), else what was wrong.
    pub(super) fn unsafe_read(&mut self, keys: &[KeyId], now: f64) -> Result<(), Unreadable> {
        let mut bad = Unreadable::default();
        for key in keys {
            match self.resident.get_mut(key) {
                Some(r) if r.read_lock.held(now) => {}
                Some(r) => {
                    bad.unlocked += 1;
                    self.locks.read_locks_expired += u64::from(r.read_lock.lapse(now));
                }
                None => bad.missing += 1,
            }
        }
        if bad != Unreadable::default() {
            return Err(bad);
        }
        for &key in keys {
            self.read_bytes(key);
        }
        Ok(())
    }

    /// The keys among `keys` that are resident and read-locked.
    pub(super) fn readable(&self, keys: &[KeyId], now: f64) -> Vec<KeyId> {
        keys.iter()
            .copied()
            .filter(|k| self.resident.get(k).is_some_and(|r| r.read_lock.held(now)))
            .collect()
    }

    /// LMCache's `finish_read`: releases `n` read locks per key (clamped to 1..=128); a
    /// temporary object whose last lock goes is deleted. Returns the deleted keys.
    pub(super) fn finish_read(&mut self, keys: &[KeyId], n: u64, now: f64) -> Vec<KeyId> {
        let n = n.clamp(1, MAX_READ_LOCKS);
        let mut freed = Vec::new();
        for &key in keys {
            let Some(r) = self.resident.get_mut(&key) else {
                self.locks.unlocks_of_unlocked += 1;
                continue;
            };
            if !r.read_lock.held(now) {
                self.locks.unlocks_of_unlocked += 1;
                self.locks.read_locks_expired += u64::from(r.read_lock.lapse(now));
                continue;
            }
            r.read_lock.unlock(n);
            if r.temporary && !r.read_lock.held(now) {
                freed.push(key);
            }
        }
        for &key in &freed {
            self.remove_resident(key);
        }
        if !freed.is_empty() {
            self.policy.on_removed(&freed);
        }
        freed
    }

    /// Reserves staging buffers for objects a prefetch loads from L2, as one batch; `None`
    /// when they do not all fit (nothing is reserved then).
    pub(super) fn reserve_for_load(&mut self, keys: &[KeyId], size: u64) -> Option<Vec<u64>> {
        let addresses = self.arena.allocate(size, keys.len())?;
        self.note_peak();
        self.policy.on_reserved(keys);
        Some(addresses)
    }

    /// LMCache's `finish_write_and_reserve_read` for loaded objects: each becomes resident
    /// and read-locked `n` times (temporary unless retained); one whose key became resident
    /// meanwhile is discarded and the resident one is locked instead.
    pub(super) fn admit_loaded(
        &mut self,
        loaded: &[(KeyId, u64)],
        size: u64,
        temporary: bool,
        n: u64,
        now: f64,
    ) {
        let mut admitted = Vec::with_capacity(loaded.len());
        for &(key, address) in loaded {
            if let Some(r) = self.resident.get_mut(&key) {
                self.arena.free(address, size);
                r.read_lock
                    .lock(n.clamp(1, MAX_READ_LOCKS), now, self.read_ttl);
                continue;
            }
            self.write_bytes(address, size);
            let mut read_lock = TtlLock::default();
            read_lock.lock(n.clamp(1, MAX_READ_LOCKS), now, self.read_ttl);
            self.resident.insert(
                key,
                Resident {
                    address,
                    size,
                    read_lock,
                    temporary,
                },
            );
            admitted.push(key);
        }
        self.policy.on_created(&admitted);
    }

    /// Gives back staging buffers a prefetch reserved but will not load.
    pub(super) fn release_loads(&mut self, keys: &[KeyId], addresses: &[u64], size: u64) {
        for &address in addresses {
            self.arena.free(address, size);
        }
        let gone: Vec<KeyId> = keys
            .iter()
            .copied()
            .filter(|k| !self.resident.contains_key(k) && !self.staging.contains_key(k))
            .collect();
        if !gone.is_empty() {
            self.policy.on_removed(&gone);
        }
    }

    fn remove_resident(&mut self, key: KeyId) -> Option<u64> {
        let r = self.resident.remove(&key)?;
        self.arena.free(r.address, r.size);
        Some(r.size)
    }

    /// LMCache's `delete` without force: removes unlocked resident objects and reclaims
    /// lapsed reservations; returns the resident objects removed.
    pub(super) fn delete(&mut self, keys: &[KeyId], now: f64) -> Vec<Evicted> {
        let mut removed = Vec::new();
        let mut gone = Vec::new();
        for &key in keys {
            let (left, evicted) = self.delete_key(key, now);
            if left {
                gone.push(key);
            }
            removed.extend(evicted);
        }
        if !gone.is_empty() {
            self.policy.on_removed(&gone);
        }
        removed
    }

    /// [`L1::delete`] of one key, without telling the policy: whether the key left the tier,
    /// and the resident object removed, if it was one.
    fn delete_key(&mut self, key: KeyId, now: f64) -> (bool, Option<Evicted>) {
        if let Some(s) = self.staging.get(&key) {
            if s.write_lock.held(now) {
                return (false, None);
            }
            let s = self.staging.remove(&key).expect("present");
            self.arena.free(s.address, s.size);
            self.locks.write_reservations_expired += 1;
            if !self.resident.contains_key(&key) {
                return (true, None);
            }
        }
        match self.resident.get(&key) {
            Some(r) if !r.read_lock.held(now) => {
                let size = self.remove_resident(key).unwrap_or(0);
                (true, Some(Evicted { key, size }))
            }
            _ => (false, None),
        }
    }

    /// LMCache's untraced `touch_keys`: tells the policy the keys were used.
    pub(super) fn touch(&mut self, keys: &[KeyId]) {
        if !keys.is_empty() {
            self.policy.on_touched(keys);
        }
    }

    /// Evicts `count` victims by policy among the evictable keys: resident and not
    /// read-locked, or staged with a lapsed write lock (LMCache's `is_key_evictable`).
    fn evict_count(&mut self, count: usize, now: f64) -> Vec<Evicted> {
        let (resident, staging) = (&self.resident, &self.staging);
        let victims = self
            .policy
            .select(count, &mut |key| evictable(resident, staging, key, now));
        let removed = self.delete(&victims, now);
        for e in &removed {
            self.count_eviction(e);
        }
        removed
    }

    /// [`L1::evict_count`] of one victim, without a list at any step: `Some(None)` when the
    /// victim was a lapsed reservation (it left, but held no resident object).
    fn evict_one(&mut self, now: f64) -> Option<Option<Evicted>> {
        let (resident, staging) = (&self.resident, &self.staging);
        let victim = self
            .policy
            .select_one(&mut |key| evictable(resident, staging, key, now))?;
        let (left, evicted) = self.delete_key(victim, now);
        if left {
            self.policy.on_removed(&[victim]);
        }
        if let Some(e) = &evicted {
            self.count_eviction(e);
        }
        Some(evicted)
    }

    fn count_eviction(&mut self, e: &Evicted) {
        self.stats.evictions += 1;
        self.stats.bytes_evicted += e.size;
    }

    /// One pass of LMCache's L1 eviction controller: when usage has reached the watermark,
    /// evicts `int(tracked × ratio)` keys (at least one). `None` when usage was below it.
    ///
    /// A sampled L1 ([`SampleScale`]) compares the whole trace's usage it stands for, and
    /// evicts the sample's share of the whole trace's victims. That is seldom a whole
    /// number (8.4 objects a pass for the 42 above): the fraction is owed to the next pass,
    /// so the victims over many passes are the share's, not rounded down at each.
    pub(super) fn eviction_pass(
        &mut self,
        watermark: f64,
        ratio: f64,
        now: f64,
    ) -> Option<Vec<Evicted>> {
        let tracked = self.policy.tracked();
        let count = match self.sample {
            None if self.usage() < watermark => return None,
            None => victim_count(tracked, ratio),
            Some(scale) => {
                let heap = scale.whole_bytes(self.arena.heap() as f64);
                let used = scale.whole_bytes(self.arena.used() as f64);
                if heap <= 0.0 || used / heap < watermark {
                    return None;
                }
                let owed = self.victims_owed + scale.victims(tracked, ratio);
                // At least one, as LMCache's own count, and the excess repaid later.
                let count = match owed.floor() {
                    n if n < 1.0 && tracked > 0 && ratio > 0.0 => 1.0,
                    n => n,
                };
                self.victims_owed = owed - count;
                count as usize
            }
        };
        Some(self.evict_count(count, now))
    }

    /// Evicts one victim at a time until `count` objects of `size` bytes fit (kvtrace's
    /// immediate timing); returns what left.
    pub(super) fn make_room(&mut self, size: u64, count: usize, now: f64) -> Vec<Evicted> {
        let mut out = Vec::new();
        while !self.arena.fits(size, count) {
            let victims = self.policy.tracked();
            match self.evict_one(now) {
                Some(Some(evicted)) => out.push(evicted),
                _ if self.policy.tracked() == victims => break,
                _ => {}
            }
        }
        out
    }

    /// The earliest time after `now` at which a held lock lapses (and so a key may become
    /// evictable), if any.
    pub(super) fn next_lapse(&self, now: f64) -> Option<f64> {
        let reads = self
            .resident
            .values()
            .filter(|r| r.read_lock.held(now))
            .map(|r| r.read_lock.deadline);
        let writes = self
            .staging
            .values()
            .filter(|s| s.write_lock.held(now))
            .map(|s| s.write_lock.deadline);
        reads.chain(writes).reduce(f64::min)
    }

    /// Empties L1 of unlocked objects (LMCache's `clear` without force).
    pub(super) fn clear(&mut self, now: f64) {
        let mut keys: Vec<KeyId> = self.resident.keys().copied().collect();
        keys.extend(self.staging.keys().copied());
        keys.sort_unstable();
        keys.dedup();
        self.delete(&keys, now);
    }

    pub(super) fn tier_stats(&self) -> TierStats {
        let mut s = self.stats.clone();
        s.resident_bytes = self.arena.used();
        s.resident_objects = self.resident.len() as u64;
        s
    }
}

#[cfg(test)]
mod tests {
    use super::super::eviction::PolicyKind;
    use super::*;

    /// A whole `reserve_write`, with no eviction between its halves.
    fn reserve(l: &mut L1, keys: &[KeyId], size: u64, now: f64) -> Reservation {
        let plan = l.plan_write(keys, now);
        l.commit_write(plan, size, now).0
    }

    fn l1(objects: u64) -> L1 {
        L1::new(
            objects * 4096,
            4096,
            PolicyKind::Lru.build(),
            L1Store::Accounting,
            (300.0, 600.0),
        )
    }

    fn ks(ns: &[u128]) -> Vec<KeyId> {
        ns.iter().map(|&n| KeyId(n)).collect()
    }

    #[test]
    fn a_reservation_is_invisible_until_admitted_and_a_resident_key_is_not_writable() {
        let mut l = l1(4);
        let r = reserve(&mut l, &ks(&[1, 2]), 4096, 0.0);
        assert_eq!(r.reserved.len(), 2);
        assert!(!l.is_resident(KeyId(1)));
        assert_eq!(l.finish_write(&ks(&[1, 2]), 0.1), ks(&[1, 2]));
        let again = reserve(&mut l, &ks(&[1, 3, 3]), 4096, 0.2);
        assert_eq!(again.not_writable, 2, "1 is resident, the second 3 repeats");
        assert_eq!(again.reserved, ks(&[3]));
    }

    #[test]
    fn a_batch_that_does_not_fit_reserves_nothing() {
        let mut l = l1(3);
        let r = reserve(&mut l, &ks(&[1, 2, 3, 4]), 4096, 0.0);
        assert!(r.out_of_memory);
        assert_eq!(l.arena.used(), 0);
    }

    /// The same batch in a sampled L1, which stands for a larger one: the leading three
    /// keys that fit are reserved, the last is refused, and the call is OUT_OF_MEMORY.
    #[test]
    fn a_sampled_batch_that_does_not_fit_reserves_its_leading_keys() {
        let mut l = l1(3);
        l.sample(SampleScale {
            trunk_objects: 0,
            trunk_bytes: 0,
            share: 0.5,
        });
        let plan = l.plan_write(&ks(&[1, 2, 3, 4]), 0.0);
        let (r, refused) = l.commit_write(plan, 4096, 0.0);
        assert!(r.out_of_memory);
        assert_eq!((r.reserved, refused), (ks(&[1, 2, 3]), ks(&[4])));
        assert_eq!(l.arena.used(), 3 * 4096);
        let plan = l.plan_write(&ks(&[5]), 0.0);
        let (r, refused) = l.commit_write(plan, 4096, 0.0);
        assert!(r.out_of_memory && r.reserved.is_empty());
        assert_eq!(refused, ks(&[5]));
    }

    #[test]
    fn read_locks_lapse_after_their_ttl_and_then_count_from_zero() {
        let mut l = l1(2);
        reserve(&mut l, &ks(&[1]), 4096, 0.0);
        l.finish_write(&ks(&[1]), 0.0);
        l.reserve_read(&ks(&[1]), 2, 1.0);
        assert!(l.unsafe_read(&ks(&[1]), 300.0).is_ok());
        assert_eq!(
            l.unsafe_read(&ks(&[1]), 301.0),
            Err(Unreadable {
                missing: 0,
                unlocked: 1
            })
        );
        l.reserve_read(&ks(&[1]), 1, 302.0);
        l.finish_read(&ks(&[1]), 1, 302.5);
        assert!(
            l.unsafe_read(&ks(&[1]), 302.5).is_err(),
            "count restarted at 1"
        );
        assert_eq!(l.locks.read_locks_expired, 1);
    }

    #[test]
    fn an_eviction_pass_takes_int_of_tracked_times_ratio_and_skips_locked_keys() {
        let mut l = l1(10);
        for n in 0..10u128 {
            reserve(&mut l, &[KeyId(n)], 4096, 0.0);
            l.finish_write(&[KeyId(n)], 0.0);
        }
        l.reserve_read(&ks(&[0]), 1, 0.0);
        assert!(l.eviction_pass(0.95, 0.2, 0.5).is_some());
        // 10 tracked × 0.2 = 2 victims; 0 is locked, so 1 and 2 go (oldest first).
        assert!(l.is_resident(KeyId(0)));
        assert!(!l.is_resident(KeyId(1)) && !l.is_resident(KeyId(2)));
        assert!(
            l.eviction_pass(0.95, 0.2, 0.6).is_none(),
            "below the watermark"
        );
    }

    /// A sampled L1 of 22 objects holding 2 trunk objects whole and half of the rest stands
    /// for an L1 of 42 (2 + 20 / 0.5). That L1's pass at ratio 0.25 evicts 10.5 objects,
    /// none of them trunk, and the sample's half of that is 5.25 a pass: 5, 5, 5, then 6 as
    /// the quarters add up, where its own count would be int(22 × 0.25) = 5 every time.
    /// After a pass 17 objects stand for 2 + 15 / 0.5 = 32 of 42 (0.762), under a watermark
    /// of 0.77 that its own usage (17 / 22, 0.773) is over.
    #[test]
    fn a_sampled_pass_evicts_its_share_of_the_whole_traces_victims() {
        let mut next = 0u128;
        let mut fill = |l: &mut L1| {
            while l.arena.used() < l.arena.heap() {
                reserve(l, &[KeyId(next)], 4096, 0.0);
                l.finish_write(&[KeyId(next)], 0.0);
                next += 1;
            }
        };
        let (mut sampled, mut own) = (l1(22), l1(22));
        sampled.sample(SampleScale {
            trunk_objects: 2,
            trunk_bytes: 2 * 4096,
            share: 0.5,
        });
        let evicted = |l: &mut L1, fill: &mut dyn FnMut(&mut L1)| {
            fill(l);
            l.eviction_pass(0.5, 0.25, 1.0).map_or(0, |v| v.len())
        };
        let passes: Vec<usize> = (0..4).map(|_| evicted(&mut sampled, &mut fill)).collect();
        assert_eq!(passes, [5, 5, 5, 6]);
        let passes: Vec<usize> = (0..4).map(|_| evicted(&mut own, &mut fill)).collect();
        assert_eq!(passes, [5, 5, 5, 5]);
        // Both hold 17 objects now, after a pass of 5.
        fill(&mut sampled);
        fill(&mut own);
        for l in [&mut sampled, &mut own] {
            assert_eq!(l.eviction_pass(0.5, 0.25, 2.0).map(|v| v.len()), Some(5));
        }
        assert!(sampled.eviction_pass(0.77, 0.25, 3.0).is_none());
        assert!(own.eviction_pass(0.77, 0.25, 3.0).is_some());
    }

    #[test]
    fn a_temporary_object_leaves_with_its_last_read_lock() {
        let mut l = l1(2);
        let addresses = l.reserve_for_load(&ks(&[7]), 4096).unwrap();
        l.admit_loaded(&[(KeyId(7), addresses[0])], 4096, true, 1, 0.0);
        assert!(l.is_resident(KeyId(7)));
        l.finish_read(&ks(&[7]), 1, 0.1);
        assert!(!l.is_resident(KeyId(7)));
        assert_eq!(l.arena.used(), 0);
    }

    /// An L1 of two 4 KiB objects in a real pool.
    fn host(touch: bool) -> L1 {
        L1::new(
            8192,
            4096,
            PolicyKind::Lru.build(),
            L1Store::Host(HostBuffer::map(8192, touch).unwrap()),
            (300.0, 600.0),
        )
    }

    #[test]
    fn the_host_pool_becomes_resident_where_objects_were_placed() {
        let mut l = host(true);
        reserve(&mut l, &ks(&[1]), 4096, 0.0);
        l.finish_write(&ks(&[1]), 0.0);
        l.reserve_read(&ks(&[1]), 1, 0.0);
        l.unsafe_read(&ks(&[1]), 0.0).unwrap();
        let L1Store::Host(buf) = &mut l.store else {
            unreachable!()
        };
        assert_eq!(buf.touched, 4096);
        assert_eq!(buf.range(0, 1)[0], 0xA5);
        assert_eq!(
            buf.range(4096, 4096)[0],
            0,
            "the free page was never touched"
        );
    }

    #[test]
    fn an_untouched_pool_places_objects_without_writing_them() {
        let mut l = host(false);
        reserve(&mut l, &ks(&[1, 2]), 4096, 0.0);
        l.finish_write(&ks(&[1, 2]), 0.0);
        assert!(l.is_resident(KeyId(2)));
        assert_eq!(l.tier_stats().backend, "memory");
        let L1Store::Host(buf) = &mut l.store else {
            unreachable!()
        };
        assert_eq!(buf.touched, 0);
        assert_eq!(buf.range(0, 8192).iter().filter(|&&b| b != 0).count(), 0);
    }
}
