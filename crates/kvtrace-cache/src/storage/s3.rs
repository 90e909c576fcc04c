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

pub use bytes::Bytes;
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

/// How long opening a connection may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long one request may take, a multipart part's included.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// How long the retries of one request may go on.
const RETRY_TIMEOUT: Duration = Duration::from_secs(10);

/// A connection to one bucket under one prefix, shareable by threads (a bench's workers):
/// each call blocks its thread on the client's runtime. Errors are one line naming the
/// server and the request.
pub struct S3Client {
    runtime: tokio::runtime::Runtime,
    store: AmazonS3,
    /// `s3 <endpoint> bucket <bucket>`, for messages.
    shown: String,
    prefix: String,
}

/// One object's parts, in order: the part of `len` bytes at `offset` of the object.
pub type Parts<'a> = &'a mut dyn FnMut(u64, usize) -> Bytes;

/// The `s3` L2 tier: what this process stored, over an [`S3Client`].
pub struct S3Tier {
    client: S3Client,
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

impl S3Client {
    /// Builds the client and checks, with one listing of the prefix, that the server
    /// answers, the bucket exists and the credentials are accepted.
    pub fn connect(target: &S3Location) -> io::Result<S3Client> {
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
        // Callers block on it from their own threads; one worker drives the connections.
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
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
        Ok(S3Client {
            runtime,
            store,
            shown,
            prefix: target.prefix.clone(),
        })
    }

    /// `s3 <endpoint> bucket <bucket>`.
    pub fn shown(&self) -> &str {
        &self.shown
    }

    /// The object name of a key.
    pub fn object_name(&self, key: KeyId) -> String {
        match self.prefix.is_empty() {
            true => key.hex(),
            false => format!("{}/{}", self.prefix.trim_end_matches('/'), key.hex()),
        }
    }

    fn run<T>(
        &self,
        what: &str,
        request: impl std::future::Future<Output = object_store::Result<T>>,
    ) -> io::Result<T> {
        self.runtime.block_on(request).map_err(|e| {
            let kind = match e {
                object_store::Error::NotFound { .. } => io::ErrorKind::NotFound,
                _ => io::ErrorKind::Other,
            };
            io::Error::new(kind, one_line(format!("{} {what}: {e}", self.shown)))
        })
    }

    /// Stores the object of `key`, `size` bytes taken from `parts`: one PUT up to
    /// [`MULTIPART_BYTES`], a multipart upload of such parts, [`PARTS_IN_FLIGHT`] at a time,
    /// above.
    pub fn put(&self, key: KeyId, size: u64, parts: Parts<'_>) -> io::Result<()> {
        let name = self.object_name(key);
        let path = Path::from(name.as_str());
        let what = format!("PUT {name}");
        if size <= MULTIPART_BYTES as u64 {
            let len = usize::try_from(size).map_err(io::Error::other)?;
            let payload = PutPayload::from(parts(0, len));
            return self.run(&what, async {
                self.store.put(&path, payload).await.map(|_| ())
            });
        }
        self.run(&what, async {
            let upload = self.store.put_multipart(&path).await?;
            let mut writer = WriteMultipart::new_with_chunk_size(upload, MULTIPART_BYTES);
            let mut offset = 0u64;
            while offset < size {
                let len = (size - offset).min(MULTIPART_BYTES as u64) as usize;
                writer.wait_for_capacity(PARTS_IN_FLIGHT).await?;
                writer.put(parts(offset, len));
                offset += len as u64;
            }
            writer.finish().await.map(|_| ())
        })
    }

    /// Reads the object of `key` whole; its length, or `None` when the bucket does not hold
    /// it.
    pub fn get(&self, key: KeyId) -> io::Result<Option<u64>> {
        let name = self.object_name(key);
        let path = Path::from(name.as_str());
        self.run(&format!("GET {name}"), async {
            match self.store.get(&path).await {
                Ok(got) => got.bytes().await.map(|b| Some(b.len() as u64)),
                Err(object_store::Error::NotFound { .. }) => Ok(None),
                Err(e) => Err(e),
            }
        })
    }

    pub fn delete(&self, key: KeyId) -> io::Result<()> {
        let name = self.object_name(key);
        let path = Path::from(name.as_str());
        self.run(&format!("DELETE {name}"), async {
            self.store.delete(&path).await
        })
    }
}

/// Two clients are the same tier when they name the same bucket and prefix.
impl PartialEq for S3Client {
    fn eq(&self, other: &S3Client) -> bool {
        (&self.shown, &self.prefix) == (&other.shown, &other.prefix)
    }
}

impl std::fmt::Debug for S3Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.shown, self.prefix)
    }
}

impl S3Tier {
    pub fn connect(target: &S3Location) -> io::Result<S3Tier> {
        Ok(S3Tier {
            client: S3Client::connect(target)?,
            sizes: KeyMap::default(),
            zeros: Bytes::new(),
            down_since: None,
        })
    }

    /// Runs one request, failing at once while the server was found down less than a
    /// second ago; a failure other than a missing object marks it down.
    fn call<T>(&mut self, request: impl FnOnce(&S3Client) -> io::Result<T>) -> io::Result<T> {
        if self
            .down_since
            .is_some_and(|at| at.elapsed() < Duration::from_secs(1))
        {
            return Err(io::Error::other(format!(
                "{}: the server did not answer its last request's retries",
                self.client.shown
            )));
        }
        let result = request(&self.client);
        match &result {
            Err(e) if e.kind() != io::ErrorKind::NotFound => self.down_since = Some(Instant::now()),
            _ => self.down_since = None,
        }
        result
    }
}

impl Backend for S3Tier {
    fn name(&self) -> &'static str {
        "s3"
    }

    fn put(&mut self, key: KeyId, size: u64) -> io::Result<()> {
        let len = usize::try_from(size.min(MULTIPART_BYTES as u64)).map_err(io::Error::other)?;
        if self.zeros.len() < len {
            self.zeros = Bytes::from(vec![0u8; len]);
        }
        let zeros = self.zeros.clone();
        self.call(|c| c.put(key, size, &mut |_, len| zeros.slice(..len)))?;
        self.sizes.insert(key, size);
        Ok(())
    }

    fn get(&mut self, key: KeyId) -> io::Result<bool> {
        let Some(&size) = self.sizes.get(&key) else {
            return Ok(false);
        };
        Ok(self.call(|c| c.get(key))? == Some(size))
    }

    fn delete(&mut self, key: KeyId) -> io::Result<()> {
        if self.sizes.remove(&key).is_some() {
            self.call(|c| c.delete(key))?;
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
