//! What a benchmark run measures, collected from every worker thread: one sample per
//! completed request (end-to-end, storage and generation time), one per storage operation
//! (host and device time, by tier and direction), and hit/miss counts by category.

use std::collections::BTreeMap;
use std::sync::Mutex;

use super::io::IoTime;
use super::tiers::TierKind;
use super::users::QosLevel;

/// One completed request.
#[derive(Clone, Copy, Debug)]
pub struct RequestSample {
    pub qos: QosLevel,
    pub e2e_s: f64,
    pub storage_s: f64,
    pub generation_s: f64,
    pub prefill_s: f64,
    pub decode_s: f64,
    pub tokens: u64,
}

/// Which lookups a hit or miss belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Category {
    /// A shared system prompt.
    SystemPrompt,
    /// An earlier turn of the conversation.
    MultiTurn,
    /// The request's own entry, read for decoding.
    User,
    /// A retrieved document chunk.
    Rag,
}

impl Category {
    pub fn name(self) -> &'static str {
        match self {
            Category::SystemPrompt => "system_prompt",
            Category::MultiTurn => "multi_turn",
            Category::User => "user",
            Category::Rag => "rag",
        }
    }
}

/// Host and device seconds of the operations on one tier in one direction.
#[derive(Clone, Debug, Default)]
pub struct OpTimes {
    pub host_s: Vec<f64>,
    pub device_s: Vec<f64>,
    pub total_s: Vec<f64>,
}

impl OpTimes {
    pub fn push(&mut self, time: IoTime) {
        self.host_s.push(time.host_s);
        self.device_s.push(time.device_s);
        self.total_s.push(time.total_s());
    }
}

#[derive(Default)]
struct Inner {
    requests: Vec<RequestSample>,
    ops: BTreeMap<(TierKind, bool), OpTimes>,
    hits: BTreeMap<Category, (u64, u64)>,
    prefill_writes: u64,
    decode_reads: u64,
    no_room: u64,
    io_errors: u64,
    first_io_error: Option<String>,
    prefix_bytes_saved: u64,
}

/// Thread-safe collector; each call takes a short lock.
#[derive(Default)]
pub struct Metrics {
    inner: Mutex<Inner>,
}

/// Everything collected, after the run.
#[derive(Clone, Debug, Default)]
pub struct Collected {
    pub requests: Vec<RequestSample>,
    /// `(tier, is_write)` → times.
    pub ops: BTreeMap<(TierKind, bool), OpTimes>,
    /// `(hits, misses)` per category.
    pub hits: BTreeMap<Category, (u64, u64)>,
    pub prefill_writes: u64,
    pub decode_reads: u64,
    /// Entries no tier could hold.
    pub no_room: u64,
    pub io_errors: u64,
    /// What the first failed read or write said, for the console line.
    pub first_io_error: Option<String>,
    /// Bytes shared-prefix hits did not have to write again.
    pub prefix_bytes_saved: u64,
}

impl Metrics {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn request(&self, sample: RequestSample) {
        self.lock().requests.push(sample);
    }

    pub fn op(&self, tier: TierKind, write: bool, time: IoTime) {
        let mut m = self.lock();
        m.ops.entry((tier, write)).or_default().push(time);
        if write {
            m.prefill_writes += 1;
        } else {
            m.decode_reads += 1;
        }
    }

    pub fn lookup(&self, category: Category, hit: bool) {
        let mut m = self.lock();
        let e = m.hits.entry(category).or_default();
        if hit {
            e.0 += 1;
        } else {
            e.1 += 1;
        }
    }

    pub fn no_room(&self) {
        self.lock().no_room += 1;
    }

    pub fn io_error(&self, e: &std::io::Error) {
        let mut m = self.lock();
        m.io_errors += 1;
        m.first_io_error.get_or_insert_with(|| e.to_string());
    }

    pub fn prefix_saved(&self, bytes: u64) {
        self.lock().prefix_bytes_saved += bytes;
    }

    /// Tokens of the requests completed, and the storage read times (s), since `mark`;
    /// moves the mark. The autoscaler's view of one window.
    pub fn window(&self, mark: &mut (usize, usize)) -> (u64, Vec<f64>) {
        let m = self.lock();
        let tokens = m.requests[mark.0.min(m.requests.len())..]
            .iter()
            .map(|r| r.tokens)
            .sum();
        mark.0 = m.requests.len();
        let reads = m
            .ops
            .get(&(TierKind::Storage, false))
            .map_or(Vec::new(), |o| {
                o.total_s[mark.1.min(o.total_s.len())..].to_vec()
            });
        mark.1 += reads.len();
        (tokens, reads)
    }

    /// Requests completed so far.
    pub fn completed(&self) -> u64 {
        self.lock().requests.len() as u64
    }

    pub fn take(&self) -> Collected {
        let m = std::mem::take(&mut *self.lock());
        Collected {
            requests: m.requests,
            ops: m.ops,
            hits: m.hits,
            prefill_writes: m.prefill_writes,
            decode_reads: m.decode_reads,
            no_room: m.no_room,
            io_errors: m.io_errors,
            first_io_error: m.first_io_error,
            prefix_bytes_saved: m.prefix_bytes_saved,
        }
    }
}

/// The `p`-th percentile with linear interpolation between closest ranks (numpy's
/// default), so figures compare with kv-cache.py's.
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    match sorted.len() {
        0 => 0.0,
        1 => sorted[0],
        n => {
            let rank = p / 100.0 * (n - 1) as f64;
            let (lo, hi) = (rank.floor() as usize, rank.ceil() as usize);
            sorted[lo] + (sorted[hi] - sorted[lo]) * (rank - lo as f64)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::percentile;

    #[test]
    fn percentiles_interpolate_like_numpy() {
        let v = [1.0, 2.0, 3.0, 4.0];
        assert_eq!(percentile(&v, 50.0), 2.5);
        assert_eq!(percentile(&v, 0.0), 1.0);
        assert_eq!(percentile(&v, 100.0), 4.0);
        assert!((percentile(&v, 95.0) - 3.85).abs() < 1e-12);
        assert_eq!(percentile(&[], 99.0), 0.0);
    }
}
