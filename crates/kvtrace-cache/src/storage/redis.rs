//! The `redis` tier: objects as values in a real Redis or Valkey server, over RESP.
//!
//! Key names are `<prefix>:<32 hex digits of the key hash>`, never the key's bytes. Values
//! are the object's (zero) payload, so the bytes really cross the connection as they would
//! for an L2 store; reads fetch them back and check their length.

use std::io;

use redis::{Commands, Connection};

use super::backend::Backend;
use super::{one_line, KeyId, KeyMap};

pub struct RedisTier {
    client: redis::Client,
    url: String,
    connection: Option<Connection>,
    /// Since when the server has been unreachable after a full round of retries: while it
    /// is, each call tries one reconnection at most once a second and otherwise fails at
    /// once, so a dead server costs a replay seconds, not hours.
    down_since: Option<std::time::Instant>,
    prefix: String,
    sizes: KeyMap<u64>,
    payload: Vec<u8>,
}

/// Pauses before each reconnection attempt after a lost connection: about 1.5 s in all, long
/// enough for a restarted server to come back, short enough that a dead one fails the call
/// soon. SET, GET and DEL are idempotent, so each is simply sent again once reconnected.
const BACKOFF_MS: [u64; 5] = [50, 100, 200, 400, 800];

/// How long a connection attempt, a send or a reply may take.
const TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

fn io_error(url: &str, e: redis::RedisError) -> io::Error {
    io::Error::other(one_line(format!("redis {url}: {e}")))
}

fn open(client: &redis::Client, url: &str) -> io::Result<Connection> {
    let mut connection = client
        .get_connection_with_timeout(TIMEOUT)
        .map_err(|e| io_error(url, e))?;
    // A server that stops answering must not hang the replay.
    connection
        .set_read_timeout(Some(TIMEOUT))
        .and_then(|()| connection.set_write_timeout(Some(TIMEOUT)))
        .map_err(|e| io_error(url, e))?;
    redis::cmd("PING")
        .query::<String>(&mut connection)
        .map_err(|e| io_error(url, e))?;
    Ok(connection)
}

impl RedisTier {
    /// Connects and checks the server answers.
    pub fn connect(url: &str, prefix: &str) -> io::Result<RedisTier> {
        let client = redis::Client::open(url).map_err(|e| io_error(url, e))?;
        let connection = open(&client, url)?;
        Ok(RedisTier {
            client,
            url: url.to_owned(),
            connection: Some(connection),
            down_since: None,
            prefix: prefix.to_owned(),
            sizes: KeyMap::default(),
            payload: Vec::new(),
        })
    }

    /// The server-side name of an object.
    pub fn key_name(&self, key: KeyId) -> String {
        format!("{}:{}", self.prefix, key.hex())
    }

    /// Runs one idempotent command, reconnecting with backoff and sending it again when the
    /// connection was lost; an error the server itself answered is returned at once.
    fn call<T>(
        &mut self,
        what: &str,
        mut command: impl FnMut(&mut Connection) -> redis::RedisResult<T>,
    ) -> io::Result<T> {
        let down = |url: &str, last: Option<String>| {
            io::Error::other(format!(
                "redis {what}: connection to {url} lost and not regained after {} attempts: {}",
                BACKOFF_MS.len() + 1,
                last.unwrap_or_else(|| "the server is down".into())
            ))
        };
        let retries = match self.down_since {
            Some(at) if at.elapsed() < std::time::Duration::from_secs(1) => {
                return Err(down(&self.url, None))
            }
            Some(_) => 0,
            None => BACKOFF_MS.len(),
        };
        let mut last = None;
        for pause in std::iter::once(0).chain(BACKOFF_MS.into_iter().take(retries)) {
            if pause > 0 {
                std::thread::sleep(std::time::Duration::from_millis(pause));
            }
            let connection = match self.connection.as_mut() {
                Some(c) => c,
                None => match open(&self.client, &self.url) {
                    Ok(c) => self.connection.insert(c),
                    Err(e) => {
                        last = Some(e.to_string());
                        continue;
                    }
                },
            };
            match command(connection) {
                Ok(v) => {
                    self.down_since = None;
                    return Ok(v);
                }
                Err(e)
                    if e.is_io_error()
                        || e.is_connection_dropped()
                        || e.is_connection_refusal() =>
                {
                    self.connection = None;
                    last = Some(one_line(e.to_string()));
                }
                Err(e) => return Err(io::Error::other(one_line(format!("redis {what}: {e}")))),
            }
        }
        self.down_since = Some(std::time::Instant::now());
        Err(down(&self.url, last))
    }
}

impl Backend for RedisTier {
    fn name(&self) -> &'static str {
        "redis"
    }

    fn put(&mut self, key: KeyId, size: u64) -> io::Result<()> {
        let len = usize::try_from(size).map_err(io::Error::other)?;
        let mut payload = std::mem::take(&mut self.payload);
        payload.resize(len, 0);
        let name = self.key_name(key);
        let result = self.call(&format!("SET {name}"), |c| {
            c.set::<_, _, ()>(&name, payload.as_slice())
        });
        self.payload = payload;
        result?;
        self.sizes.insert(key, size);
        Ok(())
    }

    fn get(&mut self, key: KeyId) -> io::Result<bool> {
        let Some(&size) = self.sizes.get(&key) else {
            return Ok(false);
        };
        let name = self.key_name(key);
        let value: Option<Vec<u8>> = self.call(&format!("GET {name}"), |c| c.get(&name))?;
        Ok(value.is_some_and(|v| v.len() as u64 == size))
    }

    fn delete(&mut self, key: KeyId) -> io::Result<()> {
        if self.sizes.remove(&key).is_some() {
            let name = self.key_name(key);
            self.call(&format!("DEL {name}"), |c| c.del::<_, ()>(&name))?;
        }
        Ok(())
    }

    fn contains(&self, key: KeyId) -> bool {
        self.sizes.contains_key(&key)
    }
}
