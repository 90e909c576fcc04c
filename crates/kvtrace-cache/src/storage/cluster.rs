//! The `resp-cluster` tier: objects in a Redis Cluster or Valkey cluster that every rank of
//! a run shares.
//!
//! Routing, redirections and topology are the `redis` crate's cluster client's: it maps each
//! key to its slot (CRC16 mod 16384) and the slot to the master that serves it, follows
//! `MOVED` (refreshing its slot map) and `ASK` (a slot being migrated during a resharding),
//! and sends a pipeline as one batch per node. This tier batches what a call names — the
//! lookups of a prefetch, the stores of a `finish_write` — into one such pipeline.
//!
//! Key names are `<prefix>:<32 hex digits of the key hash>`, as the single-server tier's,
//! never the key's bytes. Because the tier is shared, a lookup asks the cluster (`STRLEN`:
//! the object's length, 0 when absent) rather than this process's own records, and an
//! object another rank wrote is a hit ([`super::TierStats::cross_rank_hits`]).
//!
//! A node that stops answering fails the call within `RESPONSE_TIMEOUT` times
//! `RETRIES` plus the client's short backoff, with one line naming the cluster; what
//! earlier calls wrote stays in the cluster and in the report.

use std::io;
use std::time::Duration;

use redis::cluster::{cluster_pipe, ClusterClient, ClusterClientBuilder, ClusterConnection};

use super::backend::Backend;
use super::one_line;
use super::KeyId;

/// How long connecting to one node may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// How long one node may take to answer a command or a pipeline.
const RESPONSE_TIMEOUT: Duration = Duration::from_secs(5);
/// Retries of a command after a connection error or a redirection; each refreshes the slot
/// map, so a resharding's `MOVED`/`ASK` answers are followed well inside this.
const RETRIES: u32 = 4;
/// The client's backoff between retries, in milliseconds: short, so a dead node fails the
/// call in seconds.
const MIN_RETRY_WAIT_MS: u64 = 50;
const MAX_RETRY_WAIT_MS: u64 = 400;

pub struct ClusterTier {
    /// The seed nodes, as given: named in errors.
    shown: String,
    /// One connection per node this process talks to (the client's own map): a worker's
    /// pool. Each tier instance owns one, so threads never share a socket.
    connection: ClusterConnection,
    prefix: String,
    payload: Vec<u8>,
}

/// A client of the cluster whose seed nodes are `nodes` (shown as `shown` in errors), with
/// this module's timeouts and retries.
pub fn client(nodes: &[String], shown: &str) -> io::Result<ClusterClient> {
    ClusterClientBuilder::new(nodes.to_vec())
        .connection_timeout(CONNECT_TIMEOUT)
        .response_timeout(RESPONSE_TIMEOUT)
        .retries(RETRIES)
        .min_retry_wait(MIN_RETRY_WAIT_MS)
        .max_retry_wait(MAX_RETRY_WAIT_MS)
        .build()
        .map_err(|e| error(shown, "bad node list", e))
}

/// A connection of `client` that answered `PING`.
pub fn connect(client: &ClusterClient, shown: &str) -> io::Result<ClusterConnection> {
    let mut connection = client
        .get_connection()
        .map_err(|e| error(shown, "cannot connect", e))?;
    redis::cmd("PING")
        .query::<String>(&mut connection)
        .map_err(|e| error(shown, "no answer to PING", e))?;
    Ok(connection)
}

/// One line naming the cluster, what failed and why.
pub fn error(shown: &str, what: &str, e: redis::RedisError) -> io::Error {
    io::Error::other(one_line(format!("resp-cluster {shown}: {what}: {e}")))
}

/// Sends idempotent `commands` as one pipeline (one batch per node). The client follows
/// redirections of single commands but hands a pipeline's `MOVED`/`ASK` answers back as
/// errors; so when a resharding moved a slot under the batch, the batch is sent again one
/// command at a time, each following its redirection (and refreshing the slot map), and the
/// next batch is routed right. A lost connection is not retried here: the client already
/// did.
pub fn batch<T: redis::FromRedisValue>(
    connection: &mut ClusterConnection,
    commands: &[redis::Cmd],
) -> redis::RedisResult<Vec<T>> {
    let mut pipe = cluster_pipe();
    for c in commands {
        pipe.add_command(c.clone());
    }
    match pipe.query::<Vec<T>>(connection) {
        Err(e) if !(e.is_io_error() || e.is_connection_dropped() || e.is_timeout()) => {
            commands.iter().map(|c| c.query::<T>(connection)).collect()
        }
        result => result,
    }
}

impl ClusterTier {
    /// Connects to the cluster through `nodes` and checks it answers.
    pub fn connect(nodes: &[String], prefix: &str) -> io::Result<ClusterTier> {
        let shown = nodes.join(",");
        let connection = connect(&client(nodes, &shown)?, &shown)?;
        Ok(ClusterTier {
            shown,
            connection,
            prefix: prefix.to_owned(),
            payload: Vec::new(),
        })
    }

    /// The cluster-side name of an object.
    pub fn key_name(&self, key: KeyId) -> String {
        format!("{}:{}", self.prefix, key.hex())
    }

    fn error(&self, what: &str, e: redis::RedisError) -> io::Error {
        error(&self.shown, what, e)
    }
}

impl Backend for ClusterTier {
    fn name(&self) -> &'static str {
        "resp-cluster"
    }

    fn shared(&self) -> bool {
        true
    }

    fn put(&mut self, key: KeyId, size: u64) -> io::Result<()> {
        self.put_many(&[(key, size)])
    }

    /// One pipeline for the batch: the client splits it into one batch per node.
    fn put_many(&mut self, objects: &[(KeyId, u64)]) -> io::Result<()> {
        let Some(largest) = objects.iter().map(|o| o.1).max() else {
            return Ok(());
        };
        let largest = usize::try_from(largest).map_err(io::Error::other)?;
        if self.payload.len() < largest {
            self.payload.resize(largest, 0);
        }
        let commands: Vec<redis::Cmd> = objects
            .iter()
            .map(|&(key, size)| {
                let mut c = redis::cmd("SET");
                c.arg(self.key_name(key))
                    .arg(&self.payload[..size as usize]);
                c
            })
            .collect();
        batch::<()>(&mut self.connection, &commands)
            .map(drop)
            .map_err(|e| self.error(&format!("SET of {} object(s)", objects.len()), e))
    }

    fn get(&mut self, key: KeyId) -> io::Result<bool> {
        let name = self.key_name(key);
        let value: Option<Vec<u8>> = redis::cmd("GET")
            .arg(&name)
            .query(&mut self.connection)
            .map_err(|e| self.error(&format!("GET {name}"), e))?;
        Ok(value.is_some())
    }

    fn lookup(&mut self, keys: &[KeyId]) -> io::Result<Vec<Option<u64>>> {
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        let commands: Vec<redis::Cmd> = keys
            .iter()
            .map(|&key| {
                let mut c = redis::cmd("STRLEN");
                c.arg(self.key_name(key));
                c
            })
            .collect();
        let lengths: Vec<u64> = batch(&mut self.connection, &commands)
            .map_err(|e| self.error(&format!("STRLEN of {} key(s)", keys.len()), e))?;
        // A zero-length object is never written (an object has at least one byte), so 0
        // means absent.
        Ok(lengths.into_iter().map(|n| (n > 0).then_some(n)).collect())
    }

    fn delete(&mut self, key: KeyId) -> io::Result<()> {
        let name = self.key_name(key);
        redis::cmd("DEL")
            .arg(&name)
            .exec(&mut self.connection)
            .map_err(|e| self.error(&format!("DEL {name}"), e))
    }

    /// What this process stored stays (the cluster's own eviction aside); whether any
    /// object is there now is [`Backend::lookup`]'s question.
    fn contains(&self, _: KeyId) -> bool {
        true
    }
}
