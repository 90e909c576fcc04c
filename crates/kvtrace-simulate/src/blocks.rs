//! The engine's KV block pool with prefix caching, as the reference mocker keeps it: a pool
//! of block *copies*, each private (a request's own, freed with it) or cached under a chained
//! hash (findable by later requests). A cached copy is active while a request references it
//! or a reservation pins it, and inactive otherwise — still findable, still occupying room,
//! on an LRU list from which allocations evict only when the pool has no free room left. The
//! same hash may have several cached copies (two requests computed it at once); hits use the
//! oldest.
//!
//! Allocation is two-step, like the engine's: [`BlockPool::reserve`] checks that a batch of
//! fresh blocks fits (evicting inactive copies as needed, but never the prefix it reuses),
//! then the request takes its reused prefix and its fresh copies out of the reservation.

use std::collections::hash_map::Entry;

use super::BlockMap;

/// What the router's index learns from the pool after each pass.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KvEvent {
    Stored(u64),
    Removed(u64),
}

const NONE: u32 = u32::MAX;

/// The most block copies a pool is sized for when it is made.
const PRESIZED_BLOCKS: u64 = 1 << 17;

#[derive(Clone, Copy, Debug)]
struct Copy {
    /// `None`: private.
    hash: Option<u64>,
    refs: u32,
    pins: u32,
    prev: u32,
    next: u32,
}

/// Room set aside by [`BlockPool::reserve`]: the reused prefix (pinned) and the fresh copies.
#[derive(Debug, Default)]
pub struct Reservation {
    prefix: Vec<u32>,
    fresh: u32,
}

/// The copies of one block hash, oldest first: the first inline, any later ones in a list
/// of `BlockPool::later` (`NONE` when there are none). Two requests computing the same
/// block at once is rare, and the map holds an entry per cached hash: 16 bytes with its key,
/// where a list inline took 40, keep the map, probed for every block of every prompt, in
/// fewer cache lines.
#[derive(Debug, Clone, Copy)]
struct Copies {
    first: u32,
    later: u32,
}

pub struct BlockPool {
    capacity: u32,
    copies: Vec<Copy>,
    /// Slots of freed copies, reused last-freed first.
    vacant: Vec<u32>,
    live: u32,
    by_hash: BlockMap<Copies>,
    /// Lists of later copies, by [`Copies::later`]; an emptied list's slot is reused.
    later: Vec<Vec<u32>>,
    vacant_later: Vec<u32>,
    head: u32,
    tail: u32,
    inactive: u32,
    reserved: u32,
    prefix_caching: bool,
    events: Option<Vec<KvEvent>>,
    /// See [`BlockPool::changes`].
    changes: u64,
}

impl BlockPool {
    pub fn new(capacity: u64, prefix_caching: bool, track_events: bool) -> BlockPool {
        // The copies are sized for the pool up front (to a bound: a large pool a short run
        // never fills would hold memory it never uses), as growing them copied every one at
        // each doubling. Pages are touched as copies are made. Not the index: sized for a
        // pool that a run fills little, its entries would spread over pages a small table
        // keeps in cache.
        let presize = capacity.min(PRESIZED_BLOCKS) as usize;
        BlockPool {
            capacity: capacity.min(u64::from(u32::MAX - 1)) as u32,
            copies: Vec::with_capacity(presize),
            vacant: Vec::new(),
            live: 0,
            by_hash: BlockMap::default(),
            later: Vec::new(),
            vacant_later: Vec::new(),
            head: NONE,
            tail: NONE,
            inactive: 0,
            reserved: 0,
            prefix_caching,
            events: track_events.then(Vec::new),
            changes: 0,
        }
    }

    pub fn capacity(&self) -> u64 {
        u64::from(self.capacity)
    }

    pub fn prefix_caching(&self) -> bool {
        self.prefix_caching
    }

    /// Blocks in use: every copy but the inactive cached ones, plus reserved room.
    pub fn active(&self) -> u64 {
        u64::from(self.live - self.inactive + self.reserved)
    }

    /// Reports block stores and removals (for a KV-aware router).
    pub fn tracks_events(&self) -> bool {
        self.events.is_some()
    }

    /// Fresh copies that reservations without a prefix could take one by one from now,
    /// evicting as they go: the free room and every inactive copy.
    pub fn room_for_fresh(&self) -> u64 {
        u64::from(self.free_room() + self.inactive)
    }

    fn free_room(&self) -> u32 {
        self.capacity - self.live - self.reserved
    }

    fn first_copy(&self, hash: u64) -> Option<u32> {
        self.by_hash.get(&hash).map(|c| c.first)
    }

    fn is_inactive(&self, id: u32) -> bool {
        let c = &self.copies[id as usize];
        c.hash.is_some() && c.refs == 0 && c.pins == 0
    }

    /// Counts the changes that can alter what [`BlockPool::match_prefix`] finds: a hash
    /// becoming findable, a copy evicted, a cached copy turning active or inactive (a copy
    /// joining a hash already cached changes nothing a match reads). Equal counts, equal
    /// matches: a caller that asks for the same hashes pass after pass may keep its answer.
    pub fn changes(&self) -> u64 {
        self.changes
    }

    /// How many leading blocks of `hashes` are cached, and how many of those are active.
    pub fn match_prefix(&self, hashes: &[u64]) -> (usize, u64) {
        self.match_prefix_iter(hashes.iter().copied())
    }

    /// [`BlockPool::match_prefix`] over any sequence of block hashes.
    pub fn match_prefix_iter(&self, hashes: impl Iterator<Item = u64>) -> (usize, u64) {
        if !self.prefix_caching {
            return (0, 0);
        }
        let (mut hit, mut active) = (0, 0);
        for h in hashes {
            let Some(id) = self.first_copy(h) else { break };
            let c = &self.copies[id as usize];
            hit += 1;
            active += u64::from(c.refs > 0 || c.pins > 0);
        }
        (hit, active)
    }

    /// Sets aside room for `fresh` new copies after pinning the cached copies of `prefix`
    /// (which must all be cached), evicting least recently used inactive copies only as
    /// far as the free room falls short. `None`, with nothing changed, when even evicting
    /// every other inactive copy would not make room.
    pub fn reserve(&mut self, prefix: &[u64], fresh: u32) -> Option<Reservation> {
        let hits: Vec<u32> = prefix
            .iter()
            .map(|h| {
                self.first_copy(*h)
                    .expect("a reused prefix block is cached")
            })
            .collect();
        let short = fresh.saturating_sub(self.free_room());
        if short > 0 {
            let mut pinned_inactive: Vec<u32> = hits
                .iter()
                .copied()
                .filter(|&id| self.is_inactive(id))
                .collect();
            pinned_inactive.sort_unstable();
            pinned_inactive.dedup();
            if short > self.inactive - pinned_inactive.len() as u32 {
                return None;
            }
        }
        for &id in &hits {
            if self.is_inactive(id) {
                self.unlink(id);
            }
            self.copies[id as usize].pins += 1;
        }
        for _ in 0..short {
            self.evict_one();
        }
        self.reserved += fresh;
        Some(Reservation {
            prefix: hits,
            fresh,
        })
    }

    /// Turns the reservation's pinned prefix into references the request holds.
    pub fn take_prefix(&mut self, r: &mut Reservation) -> Vec<u32> {
        let ids = std::mem::take(&mut r.prefix);
        for &id in &ids {
            let c = &mut self.copies[id as usize];
            c.pins -= 1;
            c.refs += 1;
        }
        ids
    }

    /// A private copy out of the reservation's fresh room.
    pub fn take_fresh(&mut self, r: &mut Reservation) -> u32 {
        assert!(r.fresh > 0, "reservation has no fresh room");
        r.fresh -= 1;
        self.reserved -= 1;
        self.live += 1;
        let copy = Copy {
            hash: None,
            refs: 1,
            pins: 0,
            prev: NONE,
            next: NONE,
        };
        match self.vacant.pop() {
            Some(id) => {
                self.copies[id as usize] = copy;
                id
            }
            None => {
                self.copies.push(copy);
                self.copies.len() as u32 - 1
            }
        }
    }

    /// Gives back what a reservation still holds (unused fresh room, unclaimed pins).
    pub fn cancel(&mut self, r: Reservation) {
        for &id in r.prefix.iter().rev() {
            let c = &mut self.copies[id as usize];
            c.pins -= 1;
            if c.pins == 0 && c.refs == 0 {
                self.push_tail(id);
            }
        }
        self.reserved -= r.fresh;
    }

    /// Makes a private copy findable under `hash` (a later copy of a hash already cached
    /// joins it as another copy).
    pub fn cache(&mut self, id: u32, hash: u64) {
        self.copies[id as usize].hash = Some(hash);
        match self.by_hash.entry(hash) {
            Entry::Occupied(mut copies) => {
                let copies = copies.get_mut();
                if copies.later == NONE {
                    copies.later = match self.vacant_later.pop() {
                        Some(slot) => slot,
                        None => {
                            self.later.push(Vec::new());
                            self.later.len() as u32 - 1
                        }
                    };
                }
                self.later[copies.later as usize].push(id);
            }
            Entry::Vacant(slot) => {
                self.changes += 1;
                slot.insert(Copies {
                    first: id,
                    later: NONE,
                });
                if let Some(e) = self.events.as_mut() {
                    e.push(KvEvent::Stored(hash));
                }
            }
        }
    }

    /// Drops a request's reference to a copy: a private one is freed, a cached one becomes
    /// inactive (most recently used) once nothing references or pins it.
    pub fn release(&mut self, id: u32) {
        let c = &mut self.copies[id as usize];
        if c.hash.is_none() {
            self.live -= 1;
            self.vacant.push(id);
            return;
        }
        c.refs -= 1;
        if c.refs == 0 && c.pins == 0 {
            self.push_tail(id);
        }
    }

    /// Events made since the last [`BlockPool::move_events_to`] (a reservation's evictions,
    /// between passes) that the next pass's output is to publish.
    pub fn has_unpublished_events(&self) -> bool {
        self.events.as_ref().is_some_and(|e| !e.is_empty())
    }

    /// Moves the events since the last call (none unless tracking) to the end of `to`,
    /// keeping both buffers for the next pass.
    pub fn move_events_to(&mut self, to: &mut Vec<KvEvent>) {
        if let Some(events) = self.events.as_mut() {
            to.append(events);
        }
    }

    fn evict_one(&mut self) {
        let id = self.head;
        assert!(id != NONE, "prechecked inactive room disappeared");
        self.unlink(id);
        let hash = self.copies[id as usize].hash.take().expect("cached");
        self.live -= 1;
        self.vacant.push(id);
        let Entry::Occupied(mut entry) = self.by_hash.entry(hash) else {
            unreachable!("a cached copy is indexed");
        };
        let copies = entry.get_mut();
        let last = if copies.later == NONE {
            true
        } else {
            let later = &mut self.later[copies.later as usize];
            if copies.first == id {
                copies.first = later.remove(0);
            } else {
                later.retain(|&c| c != id);
            }
            if later.is_empty() {
                self.vacant_later.push(copies.later);
                copies.later = NONE;
            }
            false
        };
        if last {
            entry.remove();
            if let Some(e) = self.events.as_mut() {
                e.push(KvEvent::Removed(hash));
            }
        }
    }

    fn unlink(&mut self, id: u32) {
        self.changes += 1;
        let (p, n) = {
            let c = &self.copies[id as usize];
            (c.prev, c.next)
        };
        if p == NONE {
            self.head = n;
        } else {
            self.copies[p as usize].next = n;
        }
        if n == NONE {
            self.tail = p;
        } else {
            self.copies[n as usize].prev = p;
        }
        let c = &mut self.copies[id as usize];
        c.prev = NONE;
        c.next = NONE;
        self.inactive -= 1;
    }

    fn push_tail(&mut self, id: u32) {
        self.changes += 1;
        let tail = self.tail;
        {
            let c = &mut self.copies[id as usize];
            c.prev = tail;
            c.next = NONE;
        }
        if tail == NONE {
            self.head = id;
        } else {
            self.copies[tail as usize].next = id;
        }
        self.tail = id;
        self.inactive += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn events(pool: &mut BlockPool) -> Vec<KvEvent> {
        let mut events = Vec::new();
        pool.move_events_to(&mut events);
        events
    }

    /// A request's blocks: reserve, take, cache under `hashes`.
    fn store(pool: &mut BlockPool, hashes: &[u64]) -> Vec<u32> {
        let mut r = pool.reserve(&[], hashes.len() as u32).expect("room");
        let ids: Vec<u32> = hashes
            .iter()
            .map(|&h| {
                let id = pool.take_fresh(&mut r);
                pool.cache(id, h);
                id
            })
            .collect();
        pool.cancel(r);
        ids
    }

    fn release_leaf_first(pool: &mut BlockPool, ids: &[u32]) {
        for &id in ids.iter().rev() {
            pool.release(id);
        }
    }

    #[test]
    fn released_prefixes_stay_cached_and_occupy_room_until_evicted_leaf_first() {
        let mut pool = BlockPool::new(3, true, true);
        let a = store(&mut pool, &[10, 11, 12]);
        assert!(pool.reserve(&[], 1).is_none(), "all active");
        release_leaf_first(&mut pool, &a);
        assert_eq!(pool.active(), 0);
        assert_eq!(pool.match_prefix(&[10, 11, 99]), (2, 0));
        let mut r = pool.reserve(&[10], 1).expect("evicts the leaf");
        assert_eq!(
            pool.match_prefix(&[10, 11, 12]),
            (2, 1),
            "12 left first; 10 pinned"
        );
        assert_eq!(pool.take_prefix(&mut r), vec![a[0]]);
        pool.take_fresh(&mut r);
        pool.cancel(r);
        assert_eq!(pool.active(), 2);
        assert_eq!(
            events(&mut pool),
            [
                KvEvent::Stored(10),
                KvEvent::Stored(11),
                KvEvent::Stored(12),
                KvEvent::Removed(12)
            ]
        );
    }

    #[test]
    fn a_second_copy_of_a_hash_is_cached_too_and_the_hash_goes_with_its_last_copy() {
        let mut pool = BlockPool::new(2, true, true);
        let a = store(&mut pool, &[7]);
        let b = store(&mut pool, &[7]);
        pool.release(a[0]);
        pool.release(b[0]);
        assert_eq!(pool.active(), 0);
        events(&mut pool);
        let r = pool.reserve(&[], 1).expect("one evicted");
        assert_eq!(
            pool.match_prefix(&[7]),
            (1, 0),
            "the other copy is still cached"
        );
        assert!(events(&mut pool).is_empty());
        pool.cancel(r);
        let r = pool.reserve(&[], 2).expect("both evicted");
        assert_eq!(events(&mut pool), [KvEvent::Removed(7)]);
        pool.cancel(r);
    }

    /// Random stores, reuses, releases and evictions over a small pool: after every step
    /// whose `changes()` stood still, every probe matches as it did before the step.
    #[test]
    fn the_oldest_copy_left_is_the_one_a_match_finds() {
        let mut pool = BlockPool::new(3, true, true);
        let [a, b, c] = [0; 3].map(|_| store(&mut pool, &[7])[0]);
        // The middle copy is evicted: the oldest, still referenced, is the one found.
        pool.release(b);
        let r = pool.reserve(&[], 1).expect("b evicted");
        pool.cancel(r);
        assert_eq!(pool.match_prefix(&[7]), (1, 1));
        // The oldest goes too (b's room is free): the youngest, referenced, takes its place.
        pool.release(a);
        let r = pool.reserve(&[], 2).expect("a evicted");
        pool.cancel(r);
        assert_eq!(pool.match_prefix(&[7]), (1, 1));
        pool.release(c);
        assert_eq!(pool.match_prefix(&[7]), (1, 0));
        assert_eq!(events(&mut pool), [KvEvent::Stored(7)]);
        // A second hash with two copies reuses the freed list; evicting everything removes
        // each hash once, with its last copy.
        let d = store(&mut pool, &[9])[0];
        let e = store(&mut pool, &[9])[0];
        pool.release(e);
        pool.release(d);
        assert_eq!(pool.match_prefix(&[9]), (1, 0));
        let r = pool.reserve(&[], 3).expect("all evicted");
        pool.cancel(r);
        assert_eq!(
            events(&mut pool),
            [KvEvent::Stored(9), KvEvent::Removed(7), KvEvent::Removed(9)]
        );
        assert_eq!(pool.match_prefix(&[7]), (0, 0));
        assert_eq!(pool.match_prefix(&[9]), (0, 0));
    }

    #[test]
    fn a_match_cannot_differ_while_the_change_count_stands_still() {
        let mut rng = crate::rng::SplitMix64::new(11);
        let mut pool = BlockPool::new(12, true, false);
        // Six chains of four hashes, rotations of one another: a hash sits at different
        // depths of different chains, so one request's stores and releases reach several.
        let probes: Vec<Vec<u64>> = (0..6u64)
            .map(|first| (0..4).map(|i| (first + i) % 6).collect())
            .collect();
        let mut held: Vec<Vec<u32>> = Vec::new();
        let (mut still, mut moved) = (0, 0);
        for _ in 0..20_000 {
            let before: Vec<_> = probes.iter().map(|p| pool.match_prefix(p)).collect();
            let changes = pool.changes();
            match rng.range(0, 3) {
                0 => {
                    // A request: its cached prefix reused, the rest stored fresh.
                    let chain = &probes[rng.range(0, 5) as usize];
                    let (hit, _) = pool.match_prefix(chain);
                    let reuse = rng.range(0, hit as u64) as usize;
                    let Some(mut r) = pool.reserve(&chain[..reuse], (chain.len() - reuse) as u32)
                    else {
                        continue;
                    };
                    let mut ids = pool.take_prefix(&mut r);
                    for &h in &chain[reuse..] {
                        let id = pool.take_fresh(&mut r);
                        if rng.range(0, 3) > 0 {
                            pool.cache(id, h);
                        }
                        ids.push(id);
                    }
                    pool.cancel(r);
                    held.push(ids);
                }
                1 if !held.is_empty() => {
                    let ids = held.swap_remove(rng.range(0, held.len() as u64 - 1) as usize);
                    release_leaf_first(&mut pool, &ids);
                }
                _ => {
                    // A reservation given back unused: pins, then unpins, its prefix.
                    let chain = &probes[rng.range(0, 5) as usize];
                    let (hit, _) = pool.match_prefix(chain);
                    if let Some(r) = pool.reserve(&chain[..hit], rng.range(0, 2) as u32) {
                        pool.cancel(r);
                    }
                }
            }
            let after: Vec<_> = probes.iter().map(|p| pool.match_prefix(p)).collect();
            if pool.changes() == changes {
                assert_eq!(before, after, "a match moved while the count stood still");
                still += 1;
            } else {
                moved += 1;
            }
        }
        assert!(still > 1000 && moved > 1000, "{still} still, {moved} moved");
    }

    #[test]
    fn a_reservation_never_evicts_the_prefix_it_reuses() {
        let mut pool = BlockPool::new(2, true, false);
        let a = store(&mut pool, &[1, 2]);
        release_leaf_first(&mut pool, &a);
        assert!(
            pool.reserve(&[1, 2], 1).is_none(),
            "both inactive copies are the prefix: nothing to evict"
        );
        assert!(pool.reserve(&[1], 1).is_some());
    }
}
