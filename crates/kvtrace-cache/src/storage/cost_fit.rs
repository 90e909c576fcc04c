//! What one call to a tier costs, fitted to the calls a run measured: `service = latency +
//! bytes / bandwidth`, by least squares over every successful read (or write). A replay or a
//! bench run writes the fit into its report (`read_cost`, `write_cost` beside the tier's
//! percentiles), and `kvtrace simulate --offload-calibration` reads it back, so a simulated
//! offload tier moves data at the speed the real one was measured at instead of a guessed
//! bandwidth.
//!
//! The two terms can only be told apart when the calls moved objects of different sizes. When
//! they all had one size (LMCache's full chunks), or when the fit says larger calls were not
//! slower (a latency-bound backend: the slope is noise), the cost is taken as proportional to
//! the bytes: no latency term, the bandwidth the calls achieved. That is exact at the measured
//! size and scales linearly away from it; `one_size` says which case a report holds.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// A tier's fitted cost per call, as reports carry it.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq)]
pub struct Cost {
    /// Successful calls the fit is over.
    pub calls: u64,
    pub mean_bytes: f64,
    /// Every call moved the same number of bytes, so no latency term could be fitted.
    pub one_size: bool,
    /// The fixed part of a call, in milliseconds.
    pub latency_ms: f64,
    /// The rate of the part that grows with the bytes (MiB/s of one call, not of the tier).
    pub mib_per_s: f64,
}

impl Cost {
    /// Milliseconds one call moving `bytes` takes.
    pub fn ms(&self, bytes: u64) -> f64 {
        self.latency_ms + bytes as f64 / MIB / self.mib_per_s * 1e3
    }
}

const MIB: f64 = (1u64 << 20) as f64;

/// Running sums of (bytes, seconds) pairs, kept as means and co-moments (Welford's update) so
/// that millions of gigabyte-sized calls lose no precision.
#[derive(Clone, Copy, Debug, Default)]
pub struct CostFit {
    n: u64,
    mean_bytes: f64,
    mean_secs: f64,
    m2_bytes: f64,
    co_moment: f64,
    min_bytes: u64,
    max_bytes: u64,
}

impl CostFit {
    pub fn add(&mut self, bytes: u64, service: Duration) {
        let (x, y) = (bytes as f64, service.as_secs_f64());
        if self.n == 0 {
            self.min_bytes = bytes;
            self.max_bytes = bytes;
        }
        self.min_bytes = self.min_bytes.min(bytes);
        self.max_bytes = self.max_bytes.max(bytes);
        self.n += 1;
        let n = self.n as f64;
        let dx = x - self.mean_bytes;
        self.mean_bytes += dx / n;
        self.mean_secs += (y - self.mean_secs) / n;
        // Uses the old mean of x and the new mean of y: the standard one-pass co-moment.
        self.m2_bytes += dx * (x - self.mean_bytes);
        self.co_moment += dx * (y - self.mean_secs);
    }

    /// The fit, or `None` with no calls or no measurable time.
    pub fn cost(&self) -> Option<Cost> {
        if self.n == 0 || self.mean_secs <= 0.0 || self.mean_bytes <= 0.0 {
            return None;
        }
        let one_size = self.min_bytes == self.max_bytes;
        let proportional = Cost {
            calls: self.n,
            mean_bytes: self.mean_bytes,
            one_size,
            latency_ms: 0.0,
            mib_per_s: self.mean_bytes / MIB / self.mean_secs,
        };
        if one_size || self.m2_bytes <= 0.0 {
            return Some(proportional);
        }
        let secs_per_byte = self.co_moment / self.m2_bytes;
        let latency_s = self.mean_secs - secs_per_byte * self.mean_bytes;
        if !(secs_per_byte > 0.0 && latency_s >= 0.0 && secs_per_byte.is_finite()) {
            return Some(proportional);
        }
        Some(Cost {
            latency_ms: latency_s * 1e3,
            mib_per_s: 1.0 / (secs_per_byte * MIB),
            ..proportional
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fit(calls: &[(u64, f64)]) -> Option<Cost> {
        let mut f = CostFit::default();
        for &(bytes, ms) in calls {
            f.add(bytes, Duration::from_secs_f64(ms / 1e3));
        }
        f.cost()
    }

    #[test]
    fn calls_of_several_sizes_give_back_their_latency_and_bandwidth() {
        // 0.2 ms a call plus 1 GiB/s (1,024 MiB/s): 1 MiB takes 0.2 + 0.9765625 ms.
        let per_mib = 1e3 / 1024.0;
        let calls: Vec<(u64, f64)> = (1..=64)
            .map(|i| (i << 20, 0.2 + i as f64 * per_mib))
            .collect();
        let c = fit(&calls).expect("a fit");
        assert!(!c.one_size);
        assert_eq!(c.calls, 64);
        assert!((c.latency_ms - 0.2).abs() < 1e-6, "{c:?}");
        assert!((c.mib_per_s - 1024.0).abs() < 1e-3, "{c:?}");
        assert!((c.ms(4 << 20) - (0.2 + 4.0 * per_mib)).abs() < 1e-6);
    }

    #[test]
    fn one_size_is_proportional_and_exact_at_that_size() {
        let c = fit(&[(1 << 20, 2.0), (1 << 20, 4.0)]).expect("a fit");
        assert!(c.one_size);
        assert_eq!(c.latency_ms, 0.0);
        assert!((c.ms(1 << 20) - 3.0).abs() < 1e-9, "{c:?}");
        assert!((c.ms(2 << 20) - 6.0).abs() < 1e-9, "{c:?}");
    }

    #[test]
    fn larger_calls_that_were_not_slower_fall_back_to_the_mean_rate() {
        // Latency-bound: the big call happened to be the fast one.
        let c = fit(&[(1 << 10, 5.0), (1 << 20, 4.0)]).expect("a fit");
        assert!(!c.one_size);
        assert_eq!(c.latency_ms, 0.0);
        let mean_bytes = ((1 << 10) + (1 << 20)) as f64 / 2.0;
        assert!((c.ms(mean_bytes as u64) - 4.5).abs() < 1e-6, "{c:?}");
    }

    #[test]
    fn nothing_measured_is_no_fit() {
        assert_eq!(fit(&[]), None);
        assert_eq!(fit(&[(100, 0.0)]), None);
        assert_eq!(fit(&[(0, 1.0)]), None);
    }
}
