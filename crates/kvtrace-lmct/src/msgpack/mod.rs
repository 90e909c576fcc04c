//! msgpack encoding with msgspec's choices, and a validating zero-copy view for reading.
//!
//! Reading never trusts a length: [`RawValue::parse`] walks the whole item once, checking every
//! length against the bytes actually present, and allocates nothing. Accessors on a validated
//! view therefore cannot run off the end; they still return `Option` instead of panicking.
//!
//! [`write`](mod@write) is the encoder, [`view`] the reader.

pub mod view;
pub mod write;

pub use view::*;
pub use write::*;

/// Deepest nesting accepted. LMCache frames nest about 8 levels; this stops stack exhaustion
/// on hostile input.
pub const MAX_DEPTH: usize = 128;

/// Most items one validated value may hold (2^22). A decoded tree costs tens of bytes per
/// item, so this bounds what `dump`, `convert` and replay may allocate for one frame to a few
/// hundred MiB whatever the frame says; LMCache's largest calls (a key list of a 128k-token
/// prompt) hold about 10^5 items. A value over it is refused like any malformed one.
pub const MAX_ITEMS: u64 = 1 << 22;

/// Why a byte string is not exactly one well-formed msgpack item.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MsgpackError {
    /// Byte offset inside the item where decoding failed.
    pub at: usize,
    pub what: &'static str,
}

impl std::fmt::Display for MsgpackError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} at body byte {}", self.what, self.at)
    }
}
