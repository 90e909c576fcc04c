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

/// Local time as `YYYYmmdd_HHMMSS`, for default report file names.
pub fn local_stamp() -> String {
    let now = wall_secs() as libc::time_t;
    // SAFETY: `tm` is plain old data that `localtime_r` fills in; both pointers are valid for
    // the duration of the call and `localtime_r` keeps neither.
    let tm = unsafe {
        let mut tm: libc::tm = std::mem::zeroed();
        libc::localtime_r(&now, &mut tm);
        tm
    };
    format!(
        "{:04}{:02}{:02}_{:02}{:02}{:02}",
        tm.tm_year + 1900,
        tm.tm_mon + 1,
        tm.tm_mday,
        tm.tm_hour,
        tm.tm_min,
        tm.tm_sec
    )
}
