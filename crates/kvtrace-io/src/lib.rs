//! The file and process plumbing every kvtrace command shares, below every other kvtrace
//! crate: errors that carry the documented exit status and name the file and place
//! ([`error`]), outputs written under a temporary name and renamed into place, never over an
//! input ([`output`]), SIGINT/SIGTERM noted for a clean stop ([`interrupt`]), and bounded
//! reads of untrusted text ([`limits`]).

pub mod error;
pub mod interrupt;
pub mod limits;
pub mod output;

pub use error::{Error, Result};
