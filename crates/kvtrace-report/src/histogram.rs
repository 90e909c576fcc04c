//! Latency histograms that merge: what each rank of a run stores beside its percentiles, so
//! that `kvtrace aggregate` computes the run's percentiles from every sample rather than
//! from the ranks' percentiles (which do not combine).
//!
//! An HdrHistogram of nanoseconds, 1 ns to one hour at three significant digits (a value
//! is kept within 0.1 %), written in HdrHistogram's own interchange form — V2 encoding,
//! DEFLATE-compressed, base64 (the `HISTF…` strings HdrHistogram's tools read) — so other
//! tools can read kvtrace's files too.

use base64::Engine;
use hdrhistogram::serialization::{Deserializer, Serializer, V2DeflateSerializer};
use hdrhistogram::Histogram;

/// The largest latency kept: one hour, in nanoseconds; longer ones are clamped to it.
const MAX_NS: u64 = 3_600 * 1_000_000_000;

#[derive(Clone, Debug)]
pub struct LatencyHistogram(Histogram<u64>);

impl Default for LatencyHistogram {
    fn default() -> Self {
        LatencyHistogram::new()
    }
}

impl LatencyHistogram {
    pub fn new() -> LatencyHistogram {
        LatencyHistogram(
            Histogram::new_with_bounds(1, MAX_NS, 3).expect("constant bounds are valid"),
        )
    }

    /// Records one latency in milliseconds (clamped to 1 ns .. one hour).
    pub fn record_ms(&mut self, ms: f64) {
        self.record_n_ms(ms, 1);
    }

    /// Records `n` calls of `ms` each, as many [`LatencyHistogram::record_ms`] would.
    pub fn record_n_ms(&mut self, ms: f64, n: u64) {
        let ns = if ms.is_finite() { ms * 1e6 } else { 0.0 };
        self.0
            .saturating_record_n((ns.round() as u64).clamp(1, MAX_NS), n);
    }

    /// Adds every sample of `other`.
    pub fn merge(&mut self, other: &LatencyHistogram) {
        // Both have the same bounds, so adding cannot fail.
        let _ = self.0.add(&other.0);
    }

    pub fn count(&self) -> u64 {
        self.0.len()
    }

    /// The value at quantile `q` (0..=1), in milliseconds; 0 for an empty histogram.
    pub fn quantile_ms(&self, q: f64) -> f64 {
        if self.0.is_empty() {
            return 0.0;
        }
        self.0.value_at_quantile(q) as f64 / 1e6
    }

    pub fn mean_ms(&self) -> f64 {
        self.0.mean() / 1e6
    }

    pub fn max_ms(&self) -> f64 {
        self.0.max() as f64 / 1e6
    }

    pub fn min_ms(&self) -> f64 {
        if self.0.is_empty() {
            0.0
        } else {
            self.0.min() as f64 / 1e6
        }
    }

    /// HdrHistogram's base64 interchange text.
    pub fn encode(&self) -> String {
        let mut bytes = Vec::new();
        // Serializing into memory cannot fail for a histogram of valid bounds.
        let _ = V2DeflateSerializer::new().serialize(&self.0, &mut bytes);
        base64::engine::general_purpose::STANDARD.encode(bytes)
    }

    /// Reads [`LatencyHistogram::encode`]'s text (or any compressed HdrHistogram V2
    /// histogram of at most three significant digits); the error says what was wrong with
    /// it. The text is untrusted (a rank's output file): it is decompressed into a bounded
    /// buffer and its bounds and payload length are checked before any histogram is sized
    /// from them.
    pub fn decode(text: &str) -> Result<LatencyHistogram, String> {
        if text.len() > MAX_TEXT {
            return Err(format!("{} bytes of text: at most {MAX_TEXT}", text.len()));
        }
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(text.trim())
            .map_err(|e| format!("not base64: {e}"))?;
        let v2 = inflate(&bytes)?;
        let h: Histogram<u64> = Deserializer::new()
            .deserialize(&mut v2.as_slice())
            .map_err(|e| format!("not an HdrHistogram V2 histogram: {e:?}"))?;
        let mut ours = LatencyHistogram::new();
        ours.0
            .add(&h)
            .map_err(|e| format!("values beyond one hour: {e:?}"))?;
        Ok(ours)
    }
}

/// The most base64 text a histogram may take (a full one is a few KiB).
const MAX_TEXT: usize = 1 << 20;
/// The most bytes its V2 encoding may inflate to.
const MAX_INFLATED: u64 = 4 << 20;
const V2_COOKIE: u32 = 0x1c84_9313;
const V2_DEFLATE_COOKIE: u32 = 0x1c84_9314;
/// V2 header: cookie, payload length, normalising offset, digits (4 bytes each), lowest and
/// highest trackable value, integer-to-double ratio (8 bytes each).
const V2_HEADER: usize = 40;

fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn be64(b: &[u8], at: usize) -> u64 {
    let mut x = [0u8; 8];
    x.copy_from_slice(&b[at..at + 8]);
    u64::from_be_bytes(x)
}

/// The V2 encoding inside a compressed histogram, checked: bounds no wider than one hour of
/// nanoseconds at three digits, and a payload length that is what follows the header.
fn inflate(bytes: &[u8]) -> Result<Vec<u8>, String> {
    use std::io::Read;
    if bytes.len() < 8 || be32(bytes, 0) != V2_DEFLATE_COOKIE {
        return Err("not a compressed HdrHistogram V2 histogram".into());
    }
    let mut v2 = Vec::new();
    flate2::read::ZlibDecoder::new(&bytes[8..])
        .take(MAX_INFLATED + 1)
        .read_to_end(&mut v2)
        .map_err(|e| format!("bad DEFLATE data: {e}"))?;
    if v2.len() as u64 > MAX_INFLATED || v2.len() < V2_HEADER || be32(&v2, 0) != V2_COOKIE {
        return Err("not an HdrHistogram V2 histogram inside the compression".into());
    }
    let (payload, digits) = (be32(&v2, 4) as usize, be32(&v2, 12));
    let (low, high) = (be64(&v2, 16), be64(&v2, 24));
    if payload != v2.len() - V2_HEADER || digits > 3 || low < 1 || high > MAX_NS || low > high {
        return Err(format!(
            "histogram header out of range (payload {payload} bytes, {digits} digits, {low}..{high} ns)"
        ));
    }
    Ok(v2)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Many calls of one latency recorded at once encode as recording each of them does.
    #[test]
    fn calls_recorded_at_once_are_each_recorded() {
        for ms in [0.0, 0.25, f64::NAN] {
            let (mut at_once, mut each) = (LatencyHistogram::new(), LatencyHistogram::new());
            at_once.record_n_ms(ms, 72_162);
            (0..72_162).for_each(|_| each.record_ms(ms));
            assert_eq!(at_once.encode(), each.encode(), "{ms}");
        }
    }

    #[test]
    fn round_trips_and_merges_as_one_histogram_of_all_samples() {
        let (mut a, mut b, mut all) = (
            LatencyHistogram::new(),
            LatencyHistogram::new(),
            LatencyHistogram::new(),
        );
        for i in 1..=1000 {
            let ms = f64::from(i) * 0.01;
            if i % 3 == 0 { &mut a } else { &mut b }.record_ms(ms);
            all.record_ms(ms);
        }
        let mut merged = LatencyHistogram::decode(&a.encode()).unwrap();
        merged.merge(&LatencyHistogram::decode(&b.encode()).unwrap());
        assert_eq!(merged.count(), 1000);
        for q in [0.5, 0.9, 0.95, 0.99] {
            assert_eq!(merged.quantile_ms(q), all.quantile_ms(q));
        }
        // Three significant digits: the median 5 ms is kept within 0.1 %.
        assert!(
            (merged.quantile_ms(0.5) - 5.0).abs() < 0.006,
            "{}",
            merged.quantile_ms(0.5)
        );
        assert!(a.encode().starts_with("HISTF"), "{}", a.encode());
    }

    #[test]
    fn bad_text_is_an_error_not_a_panic() {
        let huge = {
            // A V2 header claiming bounds up to u64::MAX at five digits.
            let mut v2 = Vec::new();
            v2.extend(V2_COOKIE.to_be_bytes());
            v2.extend(0u32.to_be_bytes());
            v2.extend(0u32.to_be_bytes());
            v2.extend(5u32.to_be_bytes());
            v2.extend(1u64.to_be_bytes());
            v2.extend(u64::MAX.to_be_bytes());
            v2.extend(1f64.to_be_bytes());
            let mut z = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::fast());
            std::io::Write::write_all(&mut z, &v2).unwrap();
            let body = z.finish().unwrap();
            let mut all = V2_DEFLATE_COOKIE.to_be_bytes().to_vec();
            all.extend((body.len() as u32).to_be_bytes());
            all.extend(body);
            base64::engine::general_purpose::STANDARD.encode(all)
        };
        for bad in ["", "!!!", "SElTVEZBQUFB", "AAAA", huge.as_str()] {
            assert!(LatencyHistogram::decode(bad).is_err(), "{bad:?}");
        }
    }
}
