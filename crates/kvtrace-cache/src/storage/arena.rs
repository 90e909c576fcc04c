//! L1's address space, allocated as LMCache 0.5.6's `AddressManager` does
//! (`lmcache/v1/memory_management.py`): one heap of the configured size, sizes rounded up to
//! the alignment (4 KiB), first fit over a free list kept in address order, freed blocks
//! coalesced with their neighbours, and a batch allocated whole or not at all.
//!
//! Modelling the addresses, not just a byte count, is what makes OUT_OF_MEMORY and the usage
//! an eviction pass sees come out as on the server: the unusable tail of the heap counts as
//! free but never fits an object, and objects of several sizes fragment the heap.

use std::collections::BTreeMap;

/// Free blocks by start address; every byte of the heap is either free or allocated.
#[derive(Debug)]
pub struct Arena {
    heap: u64,
    align: u64,
    free: BTreeMap<u64, u64>,
    free_bytes: u64,
}

impl Arena {
    /// A heap of `heap` bytes; `align` must be a power of two (LMCache refuses others).
    pub fn new(heap: u64, align: u64) -> Arena {
        let align = if align.is_power_of_two() { align } else { 4096 };
        let mut free = BTreeMap::new();
        if heap > 0 {
            free.insert(0, heap);
        }
        Arena {
            heap,
            align,
            free,
            free_bytes: heap,
        }
    }

    /// The size an object of `size` bytes occupies.
    pub fn aligned(&self, size: u64) -> u64 {
        size.div_ceil(self.align).saturating_mul(self.align)
    }

    pub fn heap(&self) -> u64 {
        self.heap
    }

    /// Bytes held by allocations (LMCache's `total - free`, what the eviction watermark is
    /// compared against).
    pub fn used(&self) -> u64 {
        self.heap - self.free_bytes
    }

    /// Allocates `count` objects of `size` bytes, first fit, carving as many as fit from each
    /// free block in address order; `None` (and nothing allocated) when they do not all fit.
    /// Returns each object's address; every object occupies [`Arena::aligned`]`(size)` bytes.
    pub fn allocate(&mut self, size: u64, count: usize) -> Option<Vec<u64>> {
        let unit = self.aligned(size.max(1));
        if count == 0 {
            return Some(Vec::new());
        }
        if unit.saturating_mul(count as u64) > self.free_bytes {
            return None;
        }
        let mut remaining = count as u64;
        let mut taken: Vec<(u64, u64, u64)> = Vec::new();
        for (&start, &len) in &self.free {
            if remaining == 0 {
                break;
            }
            let n = (len / unit).min(remaining);
            if n > 0 {
                taken.push((start, len, n));
                remaining -= n;
            }
        }
        if remaining > 0 {
            return None;
        }
        let mut addresses = Vec::with_capacity(count);
        for (start, len, n) in taken {
            self.free.remove(&start);
            let used = n * unit;
            if len > used {
                self.free.insert(start + used, len - used);
            }
            addresses.extend((0..n).map(|i| start + i * unit));
            self.free_bytes -= used;
        }
        Some(addresses)
    }

    /// How many of `count` objects of `size` bytes would fit now, first fit.
    pub fn fitting(&self, size: u64, count: usize) -> usize {
        let unit = self.aligned(size.max(1));
        let mut fit = 0u64;
        for &len in self.free.values() {
            fit = fit.saturating_add(len / unit);
            if fit >= count as u64 {
                return count;
            }
        }
        fit as usize
    }

    /// Whether `count` objects of `size` bytes would fit now.
    pub fn fits(&self, size: u64, count: usize) -> bool {
        // More bytes than are free never fit: no need to walk the free list.
        let unit = self.aligned(size.max(1));
        unit.saturating_mul(count as u64) <= self.free_bytes && self.fitting(size, count) == count
    }

    /// Returns an object of `size` bytes at `address` to the free list.
    pub fn free(&mut self, address: u64, size: u64) {
        let mut start = address;
        let mut len = self.aligned(size.max(1));
        self.free_bytes += len;
        if let Some((&prev, &prev_len)) = self.free.range(..start).next_back() {
            if prev + prev_len == start {
                self.free.remove(&prev);
                start = prev;
                len += prev_len;
            }
        }
        if let Some(&next_len) = self.free.get(&(start + len)) {
            self.free.remove(&(start + len));
            len += next_len;
        }
        self.free.insert(start, len);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_heap_tail_counts_as_free_but_never_fits_an_object() {
        // 0.004 GiB of LMCache's L1 holds 32 objects of 128 KiB, not 32.77.
        let heap = (0.004 * (1u64 << 30) as f64) as u64;
        let mut a = Arena::new(heap, 4096);
        assert!(a.allocate(131072, 33).is_none());
        assert_eq!(a.used(), 0, "a failed batch allocates nothing");
        let all = a.allocate(131072, 32).expect("32 fit");
        assert_eq!(all.len(), 32);
        assert!(a.allocate(131072, 1).is_none());
        assert_eq!(a.used(), 32 * 131072);
        assert!(a.used() as f64 / heap as f64 > 0.97);
    }

    #[test]
    fn sizes_round_up_to_the_alignment() {
        let mut a = Arena::new(1 << 20, 4096);
        a.allocate(1, 1).unwrap();
        assert_eq!(a.used(), 4096);
    }

    #[test]
    fn freed_blocks_coalesce_and_first_fit_reuses_the_lowest_address() {
        let mut a = Arena::new(10 * 4096, 4096);
        let x = a.allocate(4096, 10).unwrap();
        for &addr in &x[2..5] {
            a.free(addr, 4096);
        }
        // One 3-page hole at 2..5: a 3-page object fits there and nowhere else.
        assert!(a.fits(3 * 4096, 1));
        assert_eq!((a.fitting(4096, 5), a.fitting(4096, 2)), (3, 2));
        assert_eq!(a.fitting(2 * 4096, 5), 1);
        assert_eq!(a.allocate(3 * 4096, 1), Some(vec![2 * 4096]));
        a.free(0, 4096);
        a.free(9 * 4096, 4096);
        // Two single pages free, not adjacent: a 2-page object does not fit.
        assert!(!a.fits(2 * 4096, 1));
        assert_eq!(a.allocate(4096, 2), Some(vec![0, 9 * 4096]));
    }
}
