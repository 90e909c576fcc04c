//! The file and process plumbing every kvtrace command shares, below every other kvtrace
//! crate: errors that carry the documented exit status and name the file and place
//! ([`error`]), outputs written under a temporary name and renamed into place, never over an
//! input ([`output`]), SIGINT/SIGTERM noted for a clean stop ([`interrupt`]), bounded reads
//! of untrusted text ([`limits`]), what the machine has free for a run ([`machine`]), and
//! the seeded generator and hash every workload draws from ([`rng`]), so that one seed gives
//! the same numbers in every crate, and the TLS provider HTTPS clients share ([`tls`]).

#![warn(unreachable_pub)]

pub mod error;
pub mod interrupt;
pub mod limits;
pub mod machine;
pub mod output;
pub mod rng;
pub mod tls;

pub use error::{Error, Result};
