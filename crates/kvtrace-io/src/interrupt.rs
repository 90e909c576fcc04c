//! SIGINT and SIGTERM as a request to stop at a clean point. Long loops (replay, simulate,
//! bench, convert, generate) poll [`requested`] between units of work and wind down: the
//! trace gets its trailer, the partial reports say `"interrupted": true`, temporary files go,
//! and the process exits with 128 + the signal number (130, 143). A second signal while the
//! first is being honoured ends the process at once with the same status.

use std::sync::atomic::{AtomicI32, Ordering};

static SIGNAL: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_signal(signal: libc::c_int) {
    if SIGNAL.swap(signal, Ordering::SeqCst) != 0 {
        // SAFETY: `_exit` is async-signal-safe and ends the process without unwinding.
        unsafe { libc::_exit(128 + signal) };
    }
}

/// Installs the handler for SIGINT and SIGTERM (once per process; later calls do nothing new).
pub fn install() {
    for signal in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: the handler only touches an atomic or calls `_exit`, both async-signal-safe;
        // the sigaction struct is fully initialised before the call.
        unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as usize;
            libc::sigemptyset(&mut action.sa_mask);
            action.sa_flags = libc::SA_RESTART;
            libc::sigaction(signal, &action, std::ptr::null_mut());
        }
    }
}

/// The signal that asked the process to stop, if one did.
pub fn requested() -> Option<i32> {
    match SIGNAL.load(Ordering::Relaxed) {
        0 => None,
        s => Some(s),
    }
}

/// Whether a signal asked the process to stop: the check long reads take as their stop
/// condition (`ReadOptions::stop` of the trace format).
pub fn stop_requested() -> bool {
    requested().is_some()
}

/// The exit status for a run a signal stopped: 128 + its number.
pub fn exit_status() -> Option<i32> {
    requested().map(|s| 128 + s)
}
