//! A logarithmic-bucket quantile sketch (DDSketch with 0.1 % relative accuracy) for the pooled
//! per-token distributions, whose sample count grows with every generated token. Quantiles
//! use the rounded rank `round((n - 1) · q)` and report a bucket's representative value, the
//! convention of the reports kvtrace must match; min and max are exact, mean and deviation
//! are Welford's running ones.

/// A bucket key read through [`LN_TABLE`] stands only where the quotient `ln(v) / γ` lies at
/// least this far from a whole number; nearer, the library's logarithm decides. Both ways
/// of computing the quotient are within 2e-9 of its true value for every normal `v`
/// ([`Sketch::table_key`]), so where the table's quotient is this far from a whole number,
/// both round up to the same key: the margin is five hundred times their error.
const KEY_MARGIN: f64 = 1e-6;

/// `ln γ`, the log of a bucket's growth `γ = 1 + 2α / (1 − α)` for `α` the relative
/// accuracy, 0.001: the library's `ln_1p` of `2α / (1 − α)`, written out so that a sketch calls no
/// logarithm before its first sample (checked in a test). Every bucket key depends on its
/// last bit.
const GAMMA_LN: f64 = 0.002_000_000_666_667_066_6;

/// `(1 / c, ln c)` for `c` the middle of each of the 256 equal slices of `[1, 2)`, the
/// mantissa's range: a mantissa `m` in slice `i` has `ln m = ln c + ln(m / c)` with
/// `|m / c - 1| ≤ 1/512`, where three terms of the series for `ln(1 + r)` leave an error
/// below 4e-12. Built at compile time: a table built at run time took the process's first
/// call of the library's logarithm, whose page fault cost a small simulation a fifth of its
/// time.
static LN_TABLE: [(f64, f64); 256] = ln_table();

const fn ln_table() -> [(f64, f64); 256] {
    let mut table = [(0.0, 0.0); 256];
    let mut i = 0;
    while i < 256 {
        let inverse = 1.0 / (1.0 + (i as f64 + 0.5) / 256.0);
        table[i] = (inverse, -ln_of_half_to_one(inverse));
        i += 1;
    }
    table
}

/// `ln x` for `x` in `[1/2, 1]`, where the library's logarithm cannot run (a `const fn`):
/// `2 atanh z` for `z = (x − 1) / (x + 1)`, `|z| ≤ 1/3`, by thirty terms of its series
/// (the next is below 1e-30) in Horner's order. Within 4e-16 of the library's.
const fn ln_of_half_to_one(x: f64) -> f64 {
    let z = (x - 1.0) / (x + 1.0);
    let z2 = z * z;
    let mut k = 29;
    let mut sum = 1.0 / (2 * k + 1) as f64;
    while k > 0 {
        k -= 1;
        sum = sum * z2 + 1.0 / (2 * k + 1) as f64;
    }
    2.0 * z * sum
}

#[derive(Clone, Debug)]
pub struct Sketch {
    gamma_ln: f64,
    /// `1 / gamma_ln`, for the table's keys.
    inverse_gamma_ln: f64,
    ln_table: &'static [(f64, f64); 256],
    /// Counts of consecutive bucket keys, the first being `offset`.
    buckets: Vec<u64>,
    offset: i32,
    /// Zero samples sit below every bucket.
    zeros: u64,
    moments: Moments,
    /// The last positive sample and its key: where the tokens of one pass share their gap
    /// to the bit, most samples repeat the one before and skip computing their key.
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
            gamma_ln: GAMMA_LN,
            inverse_gamma_ln: 1.0 / GAMMA_LN,
            ln_table: &LN_TABLE,
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
            let key = self.table_key(v).unwrap_or_else(|| self.exact_key(v));
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

    /// The bucket key of a positive finite sample, `ceil(ln(v) / γ)`, with the library's
    /// logarithm: the definition, which the reports kvtrace matches use.
    fn exact_key(&self, v: f64) -> i32 {
        ceil_key(v.ln() / self.gamma_ln)
    }

    /// The same key without the library's logarithm, which was the largest part of folding
    /// a run's token gaps (two a gap): the exponent's share of `ln(v)`, the table's entry
    /// for the mantissa's slice and a short series, then the key where the quotient is
    /// clear of a whole number; `None` where it is not, and for subnormal samples. Folding
    /// four million gaps into both sketches took 154 ms with the library's logarithm and
    /// 144 ms with this (best of 56 runs each).
    ///
    /// The error, for a normal `v` (exponent `e`, `|e| ≤ 1022`): the series leaves out
    /// `r⁴ / 4`, under 3.7e-12; the table's entry is within 5e-16 of its `ln c`, the
    /// reduced `r` within 1.2e-16; `e · ln 2` in double precision is within 1.2e-13, and the
    /// sums within 6e-14 more. So `ln(v)` is within 4e-12, the quotient (times about 500)
    /// within 2e-9. The library's `ln` is within one unit in the last place (1.2e-13 at
    /// most) and its division rounds once: within 1e-10.
    #[inline(always)]
    fn table_key(&self, v: f64) -> Option<i32> {
        let bits = v.to_bits();
        let biased = (bits >> 52) as i32;
        if biased == 0 {
            return None;
        }
        let (inverse_c, ln_c) = self.ln_table[((bits >> 44) & 0xff) as usize];
        let mantissa = f64::from_bits((bits & ((1 << 52) - 1)) | 1.0f64.to_bits());
        let r = mantissa * inverse_c - 1.0;
        let series = r * (1.0 + r * (-0.5 + r * (1.0 / 3.0)));
        let ln = f64::from(biased - 1023) * std::f64::consts::LN_2 + (ln_c + series);
        let quotient = ln * self.inverse_gamma_ln;
        let whole = quotient as i32;
        let fraction = quotient - f64::from(whole);
        if fraction.abs() < KEY_MARGIN || fraction.abs() > 1.0 - KEY_MARGIN {
            return None;
        }
        Some(whole + i32::from(fraction > 0.0))
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
    use super::{Sketch, GAMMA_LN, LN_TABLE};

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

    /// The table's keys are the library logarithm's wherever the table gives one: on
    /// samples spread over the whole double range, and on each side of bucket boundaries,
    /// where the table must give way; and it gives one for nearly every sample.
    #[test]
    fn table_keys_are_the_exact_keys() {
        let s = Sketch::default();
        let mut rng = crate::rng::SplitMix64::new(11);
        let mut given = 0;
        let mut samples: Vec<f64> = (0..800_000)
            .map(|i| match i % 2 {
                0 => 10f64.powf(rng.next_f64() * 615.0 - 307.0),
                _ => 0.001 + rng.next_f64() * 100.0,
            })
            .collect();
        let spread = samples.len();
        for key in (-340_000..340_000).step_by(97) {
            let boundary = (f64::from(key) * s.gamma_ln).exp();
            for ulps in -3i64..=3 {
                samples.push(f64::from_bits((boundary.to_bits() as i64 + ulps) as u64));
            }
        }
        for (i, &v) in samples.iter().enumerate() {
            assert!(v > 0.0 && v.is_finite());
            if let Some(key) = s.table_key(v) {
                assert_eq!(key, s.exact_key(v), "{v:e}");
                given += usize::from(i < spread);
            }
        }
        assert!(given * 1000 > spread * 999, "{given} of {spread}");
        assert_eq!(s.table_key(f64::MIN_POSITIVE / 4.0), None, "subnormal");
    }

    /// The constants written out are the library's: `ln γ` to the bit, each table entry
    /// within 4e-16 of the library's logarithm of its inverse.
    #[test]
    fn the_written_out_logarithms_are_the_librarys() {
        let alpha: f64 = 0.001;
        let gamma_ln = (2.0 * alpha / (1.0 - alpha)).ln_1p();
        assert_eq!(GAMMA_LN.to_bits(), gamma_ln.to_bits());
        for (i, &(inverse, ln_c)) in LN_TABLE.iter().enumerate() {
            assert_eq!(inverse, 1.0 / (1.0 + (i as f64 + 0.5) / 256.0));
            let error = (ln_c + inverse.ln()).abs();
            assert!(error <= 4e-16, "entry {i}: {error:e}");
        }
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
