//! The `redis` tier: objects as values in a real Redis or Valkey server, over RESP.
//!
//! Key names are `<prefix>:<32 hex digits of the key hash>`, never the key's bytes. Values
//! are the object's (zero) payload, so the bytes really cross the connection as they would
//! for an L2 store; reads fetch them back and check their length.

use std::io;

use redis::{Commands, Connection};

use super::backend::Backend;
use super::{KeyId, KeyMap};

pub struct RedisTier {
    connection: Connection,
    prefix: String,
    sizes: KeyMap<u64>,
    payload: Vec<u8>,
}

fn io_error(url: &str, e: redis::RedisError) -> io::Error {
    io::Error::other(format!("redis {url}: {e}"))
}

impl RedisTier {
    /// Connects and checks the server answers.
    pub fn connect(url: &str, prefix: &str) -> io::Result<RedisTier> {
        let client = redis::Client::open(url).map_err(|e| io_error(url, e))?;
        let mut connection = client.get_connection().map_err(|e| io_error(url, e))?;
        redis::cmd("PING")
            .query::<String>(&mut connection)
            .map_err(|e| io_error(url, e))?;
        Ok(RedisTier {
            connection,
            prefix: prefix.to_owned(),
            sizes: KeyMap::default(),
            payload: Vec::new(),
        })
    }

    /// The server-side name of an object.
    pub fn key_name(&self, key: KeyId) -> String {
        format!("{}:{}", self.prefix, key.hex())
    }
}

impl Backend for RedisTier {
    fn name(&self) -> &'static str {
        "redis"
    }

    fn put(&mut self, key: KeyId, size: u64) -> io::Result<()> {
        let len = usize::try_from(size).map_err(io::Error::other)?;
        self.payload.resize(len, 0);
        let name = self.key_name(key);
        self.connection
            .set::<_, _, ()>(&name, self.payload.as_slice())
            .map_err(|e| io::Error::other(format!("redis SET {name}: {e}")))?;
        self.sizes.insert(key, size);
        Ok(())
    }

    fn get(&mut self, key: KeyId) -> io::Result<bool> {
        let Some(&size) = self.sizes.get(&key) else {
            return Ok(false);
        };
        let name = self.key_name(key);
        let value: Option<Vec<u8>> = self
            .connection
            .get(&name)
            .map_err(|e| io::Error::other(format!("redis GET {name}: {e}")))?;
        Ok(value.is_some_and(|v| v.len() as u64 == size))
    }

    fn delete(&mut self, key: KeyId) -> io::Result<()> {
        if self.sizes.remove(&key).is_some() {
            let name = self.key_name(key);
            self.connection
                .del::<_, ()>(&name)
                .map_err(|e| io::Error::other(format!("redis DEL {name}: {e}")))?;
        }
        Ok(())
    }

    fn contains(&self, key: KeyId) -> bool {
        self.sizes.contains_key(&key)
    }
}
