//! The TLS crypto provider of the process's HTTPS clients.
//!
//! The s3 tier's client reaches HTTPS endpoints with rustls on ring, and Cargo unifies that
//! choice into every reqwest client of the build — the OTLP exporter's too — and rustls then
//! needs a process-wide provider before any client is built. Each such client calls
//! [`install_provider`] first; without the `tls` feature there is no rustls and it does
//! nothing.

/// Makes ring the process's rustls provider, unless one already is.
pub fn install_provider() {
    #[cfg(feature = "tls")]
    {
        // An error only says a provider is installed already, which is what is wanted.
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
}
