//! The mock engine's timing model: how long a pass takes, from what it computes. The default
//! polynomial model is fitted to a real engine; its constants are part of the contract (a
//! report is only comparable across tools when they agree on them).

use std::time::Duration;

/// Prefill milliseconds for a pass that computes `batch` prompt chunks whose integer mean
/// length after the pass is `mean_isl` tokens and before it `mean_prefix` tokens.
pub fn prefill_ms(batch: u64, mean_isl: u64, mean_prefix: u64) -> f64 {
    let per_request = mean_isl.saturating_sub(mean_prefix);
    if batch == 0 || per_request == 0 {
        return 0.0;
    }
    let n = (batch * per_request) as f64;
    4.209989e-07 * n * n + 1.518344e-02 * n + 1.650142e+01
}

/// Decode milliseconds for one token of `batch` requests: a function of the KV pool's
/// occupancy only (not of batch size or context length), never below 1 ms.
pub fn decode_ms(batch: u64, active_kv_tokens: u64, total_kv_tokens: u64) -> f64 {
    if batch == 0 {
        return 0.0;
    }
    let u = if total_kv_tokens == 0 {
        1.0
    } else {
        active_kv_tokens as f64 / total_kv_tokens as f64
    };
    (-25.74 * u * u + 54.01 * u + 5.74).max(1.0)
}

/// A phase's milliseconds as the reference engine carries them: a `Duration` of whole
/// nanoseconds, divided by `divisor` (a speedup; zero or negative means none) into another
/// `Duration`. Reproducing that rounding, not just the formula, is what keeps a long trace's
/// timestamps equal to the last bit.
pub fn quantized(ms: f64, divisor: f64) -> f64 {
    let duration = |secs: f64| Duration::try_from_secs_f64(secs).unwrap_or(Duration::MAX);
    let unscaled = duration(ms / 1000.0);
    if divisor <= 0.0 || unscaled.is_zero() {
        return unscaled.as_secs_f64() * 1000.0;
    }
    duration(unscaled.as_secs_f64() / divisor).as_secs_f64() * 1000.0
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The spot checks of the reference engine: a 5000-token prompt alone on a 16384-block
    /// pool of 512-token blocks.
    #[test]
    fn spot_checks_of_the_reference_engine() {
        let prefill = prefill_ms(1, 5000, 0);
        let decode = decode_ms(1, 10 * 512, 16384 * 512);
        assert!((prefill + decode - 108.7166).abs() < 1e-4, "TTFT");
        assert!((decode - 5.772955).abs() < 1e-6, "ITL");
        let (ttft, itl) = (prefill / 2.0 + decode / 8.0, decode / 8.0);
        assert!(
            (ttft - 52.193).abs() < 1e-3 && (itl - 0.72162).abs() < 1e-5,
            "speedups"
        );
        let sglang = decode_ms(1, 5000, 16384);
        assert!((prefill + sglang - 122.77).abs() < 1e-2 && (sglang - 19.83).abs() < 1e-2);
        assert!(
            (prefill_ms(2, 4096, 0) - 169.137).abs() < 1e-3,
            "a full 8192-token chunk"
        );
        assert!(
            (decode_ms(3, 0, 0) - 34.01).abs() < 1e-9,
            "no pool counts as full"
        );
        assert_eq!(prefill_ms(0, 10, 0) + decode_ms(0, 1, 2), 0.0);
    }
}
