//! A logarithmic-bucket quantile sketch (DDSketch with 0.1 % relative accuracy) for the pooled
//! per-token distributions, whose sample count grows with every generated token. Quantiles
//! use the rounded rank `round((n - 1) · q)` and report a bucket's representative value, the
//! convention of the reports kvtrace must match; min and max are exact, mean and deviation
//! are Welford's running ones.

const RELATIVE_ACCURACY: f64 = 0.001;

#[derive(Clone, Debug)]
pub struct Sketch {
    gamma_ln: f64,
    /// Counts of consecutive bucket keys, the first being `offset`.
    buckets: Vec<u64>,
    offset: i32,
    /// Zero samples sit below every bucket.
    zeros: u64,
    moments: Moments,
    /// The last positive sample and its key: where the tokens of one pass share their gap
    /// to the bit, most samples repeat the one before and skip the logarithm.
    last: (f64, i32),
}

/// Count, extremes, and Welford's running mean and sum of squared deviations: stable where
/// the deviation is tiny against the mean (a few µs of ITL spread on 6 ms), and, fed in the
/// same order, the same bits as the reference report's. Kept apart from the buckets so that
/// a batch holds them in registers ([`Sketch::fold_with`]): each sample's mean waits on the
/// one before through a division, and a round trip through memory lengthened that chain
/// (folding is a fifth of a 300-request simulation on one core; a tenth less with this).
#[derive(Clone, Copy, Debug)]
struct Moments {
    count: u64,
    mean: f64,
    squared_deviations: f64,
    min: f64,
    max: f64,
}

impl Moments {
    #[inline(always)]
    fn add(&mut self, v: f64) {
        self.count += 1;
        let delta = v - self.mean;
        self.mean += delta / self.count as f64;
        self.squared_deviations += delta * (v - self.mean);
        self.min = self.min.min(v);
        self.max = self.max.max(v);
    }
}

impl Default for Sketch {
    fn default() -> Self {
        Sketch {
            gamma_ln: (2.0 * RELATIVE_ACCURACY / (1.0 - RELATIVE_ACCURACY)).ln_1p(),
            buckets: Vec::new(),
            offset: 0,
            zeros: 0,
            moments: Moments {
                count: 0,
                mean: 0.0,
                squared_deviations: 0.0,
                min: f64::INFINITY,
                max: f64::NEG_INFINITY,
            },
            last: (f64::NAN, 0),
        }
    }
}

/// `x.ceil() as i32` without the library call `ceil` costs on baseline x86-64.
fn ceil_key(x: f64) -> i32 {
    let truncated = x as i32;
    if f64::from(truncated) < x {
        truncated + 1
    } else {
        truncated
    }
}

impl Sketch {
    /// An empty sketch with room for `buckets` buckets (a span of about `buckets / 500`
    /// natural-log units of the sampled values) before it allocates.
    pub fn with_room(buckets: usize) -> Sketch {
        Sketch {
            buckets: Vec::with_capacity(buckets),
            ..Sketch::default()
        }
    }

    /// Adds a non-negative sample (others are not representable and are ignored).
    pub fn add(&mut self, v: f64) {
        if self.count_sample(v) {
            self.moments.add(v);
        }
    }

    /// Adds every sample to `self`, and `derived(sample)` to `other` where that is `Some`,
    /// in order: what `add` would give, sample by sample, with both sketches' moments kept
    /// in registers over the batch so that their two chains of divisions overlap.
    pub fn fold_with(
        &mut self,
        other: &mut Sketch,
        samples: &[f64],
        derived: impl Fn(f64) -> Option<f64>,
    ) {
        let (mut mine, mut theirs) = (self.moments, other.moments);
        for &v in samples {
            if self.count_sample(v) {
                mine.add(v);
            }
            if let Some(w) = derived(v) {
                if other.count_sample(w) {
                    theirs.add(w);
                }
            }
        }
        (self.moments, other.moments) = (mine, theirs);
    }

    /// Counts `v` in its bucket; false for a sample that is not representable.
    #[inline(always)]
    fn count_sample(&mut self, v: f64) -> bool {
        if !(v >= 0.0 && v.is_finite()) {
            return false;
        }
        if v == 0.0 {
            self.zeros += 1;
            return true;
        }
        let key = if v == self.last.0 {
            self.last.1
        } else {
            let key = ceil_key(v.ln() / self.gamma_ln);
            self.last = (v, key);
            key
        };
        if self.buckets.is_empty() {
            self.offset = key;
        }
        if key < self.offset {
            let grow = (self.offset - key) as usize;
            self.buckets.splice(0..0, std::iter::repeat_n(0, grow));
            self.offset = key;
        }
        let index = (key - self.offset) as usize;
        if index >= self.buckets.len() {
            self.buckets.resize(index + 1, 0);
        }
        self.buckets[index] += 1;
        true
    }

    pub fn count(&self) -> u64 {
        self.moments.count
    }

    pub fn min(&self) -> f64 {
        if self.moments.count == 0 {
            0.0
        } else {
            self.moments.min
        }
    }

    pub fn max(&self) -> f64 {
        if self.moments.count == 0 {
            0.0
        } else {
            self.moments.max
        }
    }

    pub fn mean(&self) -> f64 {
        if self.moments.count == 0 {
            0.0
        } else {
            self.moments.mean
        }
    }

    /// Population standard deviation.
    pub fn std(&self) -> f64 {
        if self.moments.count == 0 {
            return 0.0;
        }
        (self.moments.squared_deviations / self.moments.count as f64).sqrt()
    }

    /// The `p`-th percentile (0..=100).
    pub fn percentile(&self, p: f64) -> f64 {
        if self.moments.count == 0 {
            return 0.0;
        }
        let rank = ((self.moments.count - 1) as f64 * p / 100.0).round() as u64;
        if rank < self.zeros {
            return 0.0;
        }
        let mut seen = self.zeros;
        for (index, &n) in self.buckets.iter().enumerate() {
            seen += n;
            if seen > rank {
                let key = self.offset + index as i32;
                let gamma = self.gamma_ln.exp();
                return (key as f64 * self.gamma_ln).exp() * (2.0 / (1.0 + gamma));
            }
        }
        self.moments.max
    }
}

#[cfg(test)]
mod tests {
    use super::Sketch;

    #[test]
    fn quantiles_are_within_the_relative_accuracy() {
        let mut s = Sketch::default();
        for i in 1..=10_000 {
            s.add(i as f64 / 10.0);
        }
        for p in [50.0, 90.0, 99.0] {
            let exact = ((10_000.0 - 1.0) * p / 100.0f64).round() / 10.0 + 0.1;
            let got = s.percentile(p);
            assert!(
                (got - exact).abs() / exact < 0.0011,
                "p{p}: {got} vs {exact}"
            );
        }
        assert_eq!((s.min(), s.max(), s.count()), (0.1, 1000.0, 10_000));
        assert!((s.mean() - 500.05).abs() < 1e-9);
        s.add(-1.0);
        assert_eq!(s.count(), 10_000, "negative samples are skipped");
        let mut z = Sketch::default();
        z.add(0.0);
        z.add(0.0);
        z.add(5.0);
        assert_eq!((z.percentile(50.0), z.min()), (0.0, 0.0));
    }

    /// A batch folded into two sketches at once gives each the bits that adding its samples
    /// one by one gives: zeros, repeats, negatives and infinities among them.
    #[test]
    fn a_folded_batch_equals_samples_added_one_by_one() {
        let mut rng = crate::rng::SplitMix64::new(7);
        let mut samples = Vec::new();
        for _ in 0..20_000 {
            let v = match rng.range(0, 19) {
                0 => 0.0,
                1 => -3.0,
                2 => f64::INFINITY,
                3..=9 => *samples.last().unwrap_or(&1.0),
                _ => 0.5 + rng.next_f64() * 80.0,
            };
            samples.push(v);
        }
        let derived = |v: f64| (v > 0.0).then(|| 1000.0 / v);
        let (mut a, mut b) = (Sketch::default(), Sketch::default());
        for &v in &samples {
            a.add(v);
            if let Some(w) = derived(v) {
                b.add(w);
            }
        }
        let (mut x, mut y) = (Sketch::default(), Sketch::default());
        for batch in samples.chunks(777) {
            x.fold_with(&mut y, batch, derived);
        }
        for (one, folded) in [(&a, &x), (&b, &y)] {
            assert!(one.count() > 10_000);
            assert_eq!(one.count(), folded.count());
            for figure in [Sketch::mean, Sketch::std, Sketch::min, Sketch::max] {
                assert_eq!(figure(one).to_bits(), figure(folded).to_bits());
            }
            for p in [1.0, 50.0, 99.0] {
                assert_eq!(one.percentile(p).to_bits(), folded.percentile(p).to_bits());
            }
        }
    }
}
