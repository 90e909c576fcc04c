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
    // The square first, as the reference engines compute it: the last bit of every later
    // time depends on the order.
    4.209989e-07 * (n * n) + 1.518344e-02 * n + 1.650142e+01
}

/// Decode milliseconds for one token of `batch` requests: a function of the KV pool's
/// occupancy only (not of batch size or context length; at most full), never below 1 ms.
pub fn decode_ms(batch: u64, active_kv_tokens: u64, total_kv_tokens: u64) -> f64 {
    if batch == 0 {
        return 0.0;
    }
    let u = if total_kv_tokens == 0 {
        1.0
    } else {
        (active_kv_tokens as f64 / total_kv_tokens as f64).min(1.0)
    };
    (-25.74 * (u * u) + 54.01 * u + 5.74).max(1.0)
}

/// The least [`decode_ms`] gives any batch of one or more: an empty pool's, as the
/// polynomial rises over the whole range of occupancy. A request's remaining tokens, one a
/// decode pass, then bound how soon it can end (the event loop's lookahead).
pub fn least_decode_ms() -> f64 {
    decode_ms(1, 0, 1)
}

/// A phase's milliseconds as the reference engine carries them: a `Duration` of whole
/// nanoseconds, divided by `divisor` (a speedup; zero or negative means none) into another
/// `Duration`. Reproducing that rounding, not just the formula, is what keeps a long trace's
/// timestamps equal to the last bit.
pub fn quantized(ms: f64, divisor: f64) -> f64 {
    let unscaled = duration(ms / 1000.0);
    // Below 2^20 s an f64's spacing is under a quarter of a nanosecond, so dividing by one
    // gives back the same nanoseconds: the second conversion is skipped at the default
    // speedups.
    if divisor <= 0.0 || unscaled.is_zero() || (divisor == 1.0 && unscaled.as_secs() < 1 << 20) {
        return unscaled.as_secs_f64() * 1000.0;
    }
    duration(unscaled.as_secs_f64() / divisor).as_secs_f64() * 1000.0
}

/// [`quantized`] with the last answer kept: a worker's decode step is a function of its KV
/// pool's occupancy, which changes only when a block is taken or given back, so most passes
/// ask what the pass before asked.
#[derive(Clone, Copy, Debug, Default)]
pub struct Quantizer {
    /// The bits of the last milliseconds and divisor asked, and the answer.
    last: Option<(u64, u64, f64)>,
}

impl Quantizer {
    pub fn quantized(&mut self, ms: f64, divisor: f64) -> f64 {
        let asked = (ms.to_bits(), divisor.to_bits());
        match self.last {
            Some((m, d, answer)) if (m, d) == asked => answer,
            _ => {
                let answer = quantized(ms, divisor);
                self.last = Some((asked.0, asked.1, answer));
                answer
            }
        }
    }
}

/// `Duration::try_from_secs_f64(secs)`, saturating. Below 2^20 s it is computed here, in
/// exact integer arithmetic with the same rounding (to the nearest nanosecond, a tie to
/// even): the library's general conversion was a twentieth of a simulation.
fn duration(secs: f64) -> Duration {
    if (0.0..(1u64 << 20) as f64).contains(&secs) {
        let bits = secs.to_bits();
        let exponent = ((bits >> 52) & 0x7ff) as i32;
        let mantissa = (bits & ((1 << 52) - 1)) | if exponent == 0 { 0 } else { 1 << 52 };
        // secs = mantissa · 2^(exponent - 1075), with exponent - 1075 < 0 in this range.
        let shift = (1075 - exponent.max(1)) as u32;
        let scaled = u128::from(mantissa) * 1_000_000_000;
        if shift >= 128 {
            return Duration::ZERO;
        }
        let whole = scaled >> shift;
        let rest = scaled & ((1 << shift) - 1);
        let half = 1u128 << (shift - 1);
        let nanos = whole + u128::from(rest > half || (rest == half && whole & 1 == 1));
        return Duration::from_nanos(nanos as u64);
    }
    Duration::try_from_secs_f64(secs).unwrap_or(Duration::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The integer conversion is the library's to the nanosecond, on ties included.
    #[test]
    fn the_conversion_is_the_librarys() {
        let check = |secs: f64| {
            assert_eq!(
                duration(secs),
                Duration::try_from_secs_f64(secs).unwrap_or(Duration::MAX),
                "{secs:e}"
            );
        };
        let mut x = 0x2545_f491_4f6c_dd1du64;
        for _ in 0..500_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            check(f64::from_bits(x >> 2) % (1u64 << 21) as f64);
            check(2f64.powf((x >> 11) as f64 / (1u64 << 53) as f64 * 60.0 - 40.0));
            // Odd multiples of 2^-10 s are exact half nanoseconds: ties.
            check(((x >> 40) | 1) as f64 / 1024.0);
        }
        for secs in [
            0.0,
            -0.0,
            5e-324,
            1e-10,
            4.9e-10,
            5e-10,
            1.0,
            1048575.999,
            1048576.0,
            -1.0,
            f64::NAN,
            f64::INFINITY,
        ] {
            check(secs);
        }
    }

    /// The shortcut for a divisor of one gives the bits of the two conversions it skips.
    #[test]
    fn a_divisor_of_one_gives_the_two_conversions_bits() {
        let full = |ms: f64| {
            let d = Duration::from_secs_f64(ms / 1000.0);
            Duration::from_secs_f64(d.as_secs_f64()).as_secs_f64() * 1000.0
        };
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for i in 0..200_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            // Spread over 1 ns .. 2^20 s, uniform in the exponent.
            let ms = 1e-6 * 2f64.powf((x >> 11) as f64 / (1u64 << 53) as f64 * 50.0);
            let ms = if i % 7 == 0 { ms.round() + 0.5e-6 } else { ms };
            assert_eq!(quantized(ms, 1.0).to_bits(), full(ms).to_bits(), "{ms}");
        }
    }

    /// The kept answer is the computed one, whatever was asked before it.
    #[test]
    fn a_quantizer_answers_as_quantized_does() {
        let mut q = Quantizer::default();
        let asked = [
            (5.772955, 1.0),
            (5.772955, 1.0),
            (5.772955, 2.0),
            (6.1, 2.0),
            (6.1, 2.0),
            (5.772955, 1.0),
            (0.0, 1.0),
            (-0.0, 1.0),
            (f64::NAN, 1.0),
            (f64::NAN, 1.0),
        ];
        for (ms, divisor) in asked {
            assert_eq!(
                q.quantized(ms, divisor).to_bits(),
                quantized(ms, divisor).to_bits(),
                "{ms} / {divisor}"
            );
        }
    }

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

    #[test]
    fn no_decode_pass_is_faster_than_the_least() {
        let least = least_decode_ms();
        assert_eq!(least, 5.74);
        for total in [0, 1, 7, 1000, 16384 * 512] {
            for step in 0..=4096u64 {
                let active = total * step / 4096;
                for batch in [1, 2, 300] {
                    assert!(
                        decode_ms(batch, active, total) >= least,
                        "{active} of {total}"
                    );
                    assert!(decode_ms(batch, active + total, total) >= least);
                }
            }
        }
    }
}
