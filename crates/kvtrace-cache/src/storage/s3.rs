//! The `s3` tier: objects in an S3-compatible object store (AWS S3, MinIO, Ceph RGW, s3s-fs),
//! through the `object_store` crate.
//!
//! Object names are `<prefix>/<32 hex digits of the key hash>`, never the key's bytes. The
//! payload is the object's (zero) bytes, so they really cross the network as an L2 store's
//! would; reads fetch them back and check their length. Objects larger than
//! [`MULTIPART_BYTES`] go up as multipart uploads of that part size, at most
//! [`PARTS_IN_FLIGHT`] parts at a time.
//!
//! Credentials come from the environment as the AWS tools read them — `AWS_ACCESS_KEY_ID`,
//! `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`, else the profile `AWS_PROFILE` (or
//! `default`) of the shared credentials file (`AWS_SHARED_CREDENTIALS_FILE`, or
//! `~/.aws/credentials`) — and never from a configuration or a trace. The region is the
//! tier's `region`, else `AWS_REGION`, `AWS_DEFAULT_REGION`, else `us-east-1`.

use std::io;
use std::time::{Duration, Instant};

use bytes::Bytes;
use object_store::aws::{AmazonS3, AmazonS3Builder};
use object_store::path::Path;
use object_store::{
    BackoffConfig, ClientOptions, ObjectStoreExt, PutPayload, RetryConfig, WriteMultipart,
};

use super::backend::Backend;
use super::config::S3Location;
use super::{one_line, KeyId, KeyMap};

/// Objects above this many bytes are multipart uploads of parts this large (S3 takes parts
/// of 5 MiB and more).
pub const MULTIPART_BYTES: usize = 8 << 20;

/// How many parts of one multipart upload are sent at once.
pub const PARTS_IN_FLIGHT: usize = 4;

/// How long a connection, a request, and all retries of one request may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
const RETRY_TIMEOUT: Duration = Duration::from_secs(10);

pub struct S3Tier {
    runtime: tokio::runtime::Runtime,
    store: AmazonS3,
    /// `s3 <endpoint> bucket <bucket>`, for messages.
    shown: String,
    prefix: String,
    sizes: KeyMap<u64>,
    /// Zeros at least as long as the largest object so far: payloads are slices of it.
    zeros: Bytes,
    /// Since when the server has been unreachable after a request's retries ran out: while
    /// it is, a call fails at once unless a second has passed, so a dead server costs a
    /// replay seconds, not a request timeout per object.
    down_since: Option<Instant>,
}

/// Access key, secret and session token from the shared credentials file's `profile`
/// section (`key = value` lines under `[profile]`).
fn credentials_file(text: &str, profile: &str) -> Option<(String, String, Option<String>)> {
    let mut in_profile = false;
    let (mut id, mut secret, mut token) = (None, None, None);
    for line in text.lines().map(str::trim) {
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            in_profile = name.trim() == profile;
            continue;
        }
        let Some((key, value)) = line.split_once('=') else {
            continue;
        };
        if !in_profile {
            continue;
        }
        let value = value.trim().to_owned();
        match key.trim() {
            "aws_access_key_id" => id = Some(value),
            "aws_secret_access_key" => secret = Some(value),
            "aws_session_token" => token = Some(value),
            _ => {}
        }
    }
    Some((id?, secret?, token))
}

impl S3Tier {
    /// Builds the client and checks, with one listing of the prefix, that the server
    /// answers, the bucket exists and the credentials are accepted.
    pub fn connect(target: &S3Location) -> io::Result<S3Tier> {
        let shown = format!(
            "s3 {} bucket {}",
            target.endpoint.as_deref().unwrap_or("(AWS)"),
            target.bucket
        );
        let fail = |e: &dyn std::fmt::Display| io::Error::other(one_line(format!("{shown}: {e}")));
        kvtrace_io::tls::install_provider();
        let mut builder = AmazonS3Builder::from_env()
            .with_bucket_name(&target.bucket)
            .with_retry(RetryConfig {
                backoff: BackoffConfig {
                    init_backoff: Duration::from_millis(50),
                    max_backoff: Duration::from_secs(2),
                    base: 2.0,
                },
                max_retries: 5,
                retry_timeout: RETRY_TIMEOUT,
            })
            .with_client_options(
                ClientOptions::new()
                    .with_connect_timeout(CONNECT_TIMEOUT)
                    .with_timeout(REQUEST_TIMEOUT),
            );
        if std::env::var_os("AWS_ACCESS_KEY_ID").is_none() {
            let path = std::env::var_os("AWS_SHARED_CREDENTIALS_FILE")
                .map(std::path::PathBuf::from)
                .or_else(|| {
                    std::env::var_os("HOME")
                        .map(|h| std::path::Path::new(&h).join(".aws/credentials"))
                });
            let profile = std::env::var("AWS_PROFILE").unwrap_or_else(|_| "default".into());
            let found = path
                .and_then(|p| std::fs::read_to_string(p).ok())
                .and_then(|text| credentials_file(&text, &profile));
            if let Some((id, secret, token)) = found {
                builder = builder
                    .with_access_key_id(id)
                    .with_secret_access_key(secret);
                if let Some(token) = token {
                    builder = builder.with_token(token);
                }
            }
        }
        let region = target
            .region
            .clone()
            .or_else(|| std::env::var("AWS_REGION").ok())
            .or_else(|| std::env::var("AWS_DEFAULT_REGION").ok())
            .unwrap_or_else(|| "us-east-1".into());
        builder = builder.with_region(region);
        if let Some(endpoint) = &target.endpoint {
            builder = builder
                .with_endpoint(endpoint)
                .with_allow_http(endpoint.starts_with("http://"))
                .with_virtual_hosted_style_request(false);
        }
        let store = builder.build().map_err(|e| fail(&e))?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| fail(&e))?;
        let prefix = Path::from(target.prefix.as_str());
        runtime
            .block_on(object_store::ObjectStore::list_with_delimiter(
                &store,
                Some(&prefix),
            ))
            .map_err(|e| fail(&e))?;
        Ok(S3Tier {
            runtime,
            store,
            shown,
            prefix: target.prefix.clone(),
            sizes: KeyMap::default(),
            zeros: Bytes::new(),
            down_since: None,
        })
    }

    /// The object name of a key.
    pub fn object_name(&self, key: KeyId) -> String {
        match self.prefix.is_empty() {
            true => key.hex(),
            false => format!("{}/{}", self.prefix.trim_end_matches('/'), key.hex()),
        }
    }

    /// Runs one request (object_store retries it with backoff), failing at once while the
    /// server was found down less than a second ago.
    fn call<T>(
        &mut self,
        what: &str,
        request: impl std::future::Future<Output = object_store::Result<T>>,
    ) -> io::Result<T> {
        if self
            .down_since
            .is_some_and(|at| at.elapsed() < Duration::from_secs(1))
        {
            return Err(io::Error::other(format!(
                "{} {what}: the server did not answer its last request's retries",
                self.shown
            )));
        }
        match self.runtime.block_on(request) {
            Ok(v) => {
                self.down_since = None;
                Ok(v)
            }
            Err(e) => {
                if !matches!(e, object_store::Error::NotFound { .. }) {
                    self.down_since = Some(Instant::now());
                }
                Err(io::Error::other(one_line(format!(
                    "{} {what}: {e}",
                    self.shown
                ))))
            }
        }
    }

    fn payload(&mut self, len: usize) -> Bytes {
        if self.zeros.len() < len {
            self.zeros = Bytes::from(vec![0u8; len]);
        }
        self.zeros.slice(..len)
    }
}

/// Uploads `payload` in parts of [`MULTIPART_BYTES`], [`PARTS_IN_FLIGHT`] at a time.
async fn put_multipart(store: &AmazonS3, path: &Path, payload: Bytes) -> object_store::Result<()> {
    let upload = store.put_multipart(path).await?;
    let mut writer = WriteMultipart::new_with_chunk_size(upload, MULTIPART_BYTES);
    for part in payload.chunks(MULTIPART_BYTES) {
        writer.wait_for_capacity(PARTS_IN_FLIGHT).await?;
        writer.write(part);
    }
    writer.finish().await.map(|_| ())
}

impl Backend for S3Tier {
    fn name(&self) -> &'static str {
        "s3"
    }

    fn put(&mut self, key: KeyId, size: u64) -> io::Result<()> {
        let len = usize::try_from(size).map_err(io::Error::other)?;
        let payload = self.payload(len);
        let name = self.object_name(key);
        let path = Path::from(name.as_str());
        let store = self.store.clone();
        let what = format!("PUT {name}");
        if len > MULTIPART_BYTES {
            self.call(
                &what,
                async move { put_multipart(&store, &path, payload).await },
            )?;
        } else {
            self.call(&what, async move {
                store
                    .put(&path, PutPayload::from(payload))
                    .await
                    .map(|_| ())
            })?;
        }
        self.sizes.insert(key, size);
        Ok(())
    }

    fn get(&mut self, key: KeyId) -> io::Result<bool> {
        let Some(&size) = self.sizes.get(&key) else {
            return Ok(false);
        };
        let name = self.object_name(key);
        let path = Path::from(name.as_str());
        let store = self.store.clone();
        let read = self.call(&format!("GET {name}"), async move {
            match store.get(&path).await {
                Ok(got) => got.bytes().await.map(|b| Some(b.len() as u64)),
                Err(object_store::Error::NotFound { .. }) => Ok(None),
                Err(e) => Err(e),
            }
        })?;
        Ok(read == Some(size))
    }

    fn delete(&mut self, key: KeyId) -> io::Result<()> {
        if self.sizes.remove(&key).is_some() {
            let name = self.object_name(key);
            let path = Path::from(name.as_str());
            let store = self.store.clone();
            self.call(&format!("DELETE {name}"), async move {
                store.delete(&path).await
            })?;
        }
        Ok(())
    }

    fn contains(&self, key: KeyId) -> bool {
        self.sizes.contains_key(&key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_credentials_file_is_read_for_the_named_profile_only() {
        let text = "[default]\naws_access_key_id = AK\naws_secret_access_key=SK\n\n\
                    [other]\naws_access_key_id = OK\naws_secret_access_key = OS\n\
                    aws_session_token = T\n";
        assert_eq!(
            credentials_file(text, "default"),
            Some(("AK".into(), "SK".into(), None))
        );
        assert_eq!(
            credentials_file(text, "other"),
            Some(("OK".into(), "OS".into(), Some("T".into())))
        );
        assert_eq!(credentials_file(text, "missing"), None);
        assert_eq!(
            credentials_file("[default]\naws_access_key_id = A\n", "default"),
            None
        );
    }
}
