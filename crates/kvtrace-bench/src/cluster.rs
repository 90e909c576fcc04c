//! The benchmark's storage tier in a Redis Cluster or Valkey cluster that every rank of a
//! run shares (`--storage-tier '{"type":"resp-cluster","nodes":[...]}'`).
//!
//! An entry is as large as a whole request's KV (hundreds of MiB for a long context), more
//! than one Redis value should hold and more than a worker should buffer; so it is stored
//! as [`CHUNK`]-sized values `<prefix>:{<key hex>}:<i>` and a header `<prefix>:{<key hex>}`
//! holding its length, written last: a reader that finds the header finds a whole entry.
//! The braces are a hash tag, so an entry's values share one slot and each batch of
//! `GROUP` chunks is one pipeline to one node; a worker never holds more than a batch.
//! Routing, `MOVED`/`ASK` and timeouts are [`kvtrace_cache::storage::cluster`]'s.
//!
//! Workers take a connection from a pool and put it back after the operation: each
//! connection serves one thread at a time, and one that failed is dropped, not reused.

use std::io;
use std::sync::Mutex;
use std::time::Instant;

use redis::cluster::{ClusterClient, ClusterConnection};

use super::io::{IoBuffer, IoTime, CHUNK};
use kvtrace_cache::storage::cluster::{batch, client, connect, error};
use kvtrace_cache::storage::KeyId;

/// Chunks per pipeline: 4 MiB in flight per worker.
const GROUP: u64 = 16;

/// The chunk numbers of an entry of `size` bytes, a pipeline's worth at a time.
fn groups(size: u64) -> impl Iterator<Item = std::ops::Range<u64>> {
    let chunks = size.div_ceil(CHUNK as u64);
    (0..chunks)
        .step_by(GROUP as usize)
        .map(move |first| first..(first + GROUP).min(chunks))
}

pub struct ClusterStore {
    /// The seed nodes, as given: named in errors.
    shown: String,
    prefix: String,
    client: ClusterClient,
    pool: Mutex<Vec<ClusterConnection>>,
}

impl std::fmt::Debug for ClusterStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "resp-cluster {} ({})", self.shown, self.prefix)
    }
}

impl PartialEq for ClusterStore {
    fn eq(&self, other: &ClusterStore) -> bool {
        (&self.shown, &self.prefix) == (&other.shown, &other.prefix)
    }
}

impl ClusterStore {
    /// Connects through `nodes` and checks the cluster answers.
    pub fn connect(nodes: &[String], prefix: &str) -> io::Result<ClusterStore> {
        let shown = nodes.join(",");
        let client = client(nodes, &shown)?;
        let first = connect(&client, &shown)?;
        Ok(ClusterStore {
            shown,
            prefix: prefix.to_owned(),
            client,
            pool: Mutex::new(vec![first]),
        })
    }

    /// The seed nodes, comma-separated.
    pub fn nodes(&self) -> &str {
        &self.shown
    }

    fn header(&self, key: KeyId) -> String {
        format!("{}:{{{}}}", self.prefix, key.hex())
    }

    /// Runs `f` on a pooled connection; a connection whose operation failed is dropped.
    fn with_connection<T>(
        &self,
        f: impl FnOnce(&mut ClusterConnection) -> io::Result<T>,
    ) -> io::Result<T> {
        let pooled = self.pool.lock().unwrap_or_else(|p| p.into_inner()).pop();
        let mut connection = match pooled {
            Some(c) => c,
            None => connect(&self.client, &self.shown)?,
        };
        let result = f(&mut connection);
        if result.is_ok() {
            self.pool
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(connection);
        }
        result
    }

    /// Writes an entry of `size` bytes stamped `stamp`: its chunks, then its header.
    pub fn write(
        &self,
        key: KeyId,
        size: u64,
        stamp: u64,
        buf: &mut IoBuffer,
    ) -> io::Result<IoTime> {
        let began = Instant::now();
        let header = self.header(key);
        self.with_connection(|connection| {
            for group in groups(size) {
                buf.check()?;
                let (first, last) = (group.start, group.end);
                let commands: Vec<redis::Cmd> = group
                    .map(|i| {
                        let offset = i * CHUNK as u64;
                        let len = (size - offset).min(CHUNK as u64) as usize;
                        let mut c = redis::cmd("SET");
                        c.arg(format!("{header}:{i}"))
                            .arg(buf.fill(len, stamp, offset));
                        c
                    })
                    .collect();
                batch::<()>(connection, &commands).map_err(|e| {
                    error(
                        &self.shown,
                        &format!("SET of {header} chunks {first}..{last}"),
                        e,
                    )
                })?;
            }
            redis::cmd("SET")
                .arg(&header)
                .arg(size)
                .exec(connection)
                .map_err(|e| error(&self.shown, &format!("SET {header}"), e))
        })?;
        Ok(IoTime {
            host_s: 0.0,
            device_s: began.elapsed().as_secs_f64(),
        })
    }

    /// Reads a whole entry back, a batch of chunks at a time; its size, or `None` when the
    /// cluster does not hold all of it (never written, or evicted by the cluster's own
    /// policy since).
    pub fn read(&self, key: KeyId, buf: &mut IoBuffer) -> io::Result<Option<(u64, IoTime)>> {
        let began = Instant::now();
        let header = self.header(key);
        let size = self.with_connection(|connection| {
            let size: Option<u64> = redis::cmd("GET")
                .arg(&header)
                .query(connection)
                .map_err(|e| error(&self.shown, &format!("GET {header}"), e))?;
            let Some(size) = size else {
                return Ok(None);
            };
            for group in groups(size) {
                buf.check()?;
                let (first, last) = (group.start, group.end);
                let commands: Vec<redis::Cmd> = group
                    .map(|i| {
                        let mut c = redis::cmd("GET");
                        c.arg(format!("{header}:{i}"));
                        c
                    })
                    .collect();
                let values: Vec<Option<Vec<u8>>> = batch(connection, &commands).map_err(|e| {
                    error(
                        &self.shown,
                        &format!("GET of {header} chunks {first}..{last}"),
                        e,
                    )
                })?;
                if values.iter().any(Option::is_none) {
                    return Ok(None);
                }
            }
            Ok(Some(size))
        })?;
        Ok(size.map(|size| {
            (
                size,
                IoTime {
                    host_s: 0.0,
                    device_s: began.elapsed().as_secs_f64(),
                },
            )
        }))
    }

    /// Removes an entry of `size` bytes: its header first, so no reader sees a part.
    pub fn delete(&self, key: KeyId, size: u64) -> io::Result<()> {
        let header = self.header(key);
        self.with_connection(|connection| {
            let mut commands = vec![redis::cmd("DEL").arg(&header).to_owned()];
            commands.extend(
                (0..size.div_ceil(CHUNK as u64))
                    .map(|i| redis::cmd("DEL").arg(format!("{header}:{i}")).to_owned()),
            );
            batch::<()>(connection, &commands)
                .map(drop)
                .map_err(|e| error(&self.shown, &format!("DEL {header}"), e))
        })
    }
}
