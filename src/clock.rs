//! The two clocks LMCT records carry: `CLOCK_MONOTONIC` seconds (Python's
//! `time.monotonic()`, comparable with LMCache's `t_mono_start`) and Unix wall time.

use std::time::{SystemTime, UNIX_EPOCH};

/// Seconds on the system monotonic clock (seconds since boot on Linux).
pub fn monotonic_secs() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec and CLOCK_MONOTONIC is always available on
    // the platforms kvtrace supports; the call only writes into `ts`.
    unsafe {
        libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts);
    }
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

/// Seconds since the Unix epoch.
pub fn wall_secs() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}
