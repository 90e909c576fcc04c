//! The Redis tier against a real `redis-server` started on a loopback port for each test.
//! Skips with a message where `redis-server` is not installed (`.ci/run` installs it).
#![cfg(feature = "redis")]

use std::net::TcpListener;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::util::{free_port, kvtrace, sample, scratch, text, KillOnDrop};
use kvtrace::replay::{replay, ReplayOptions};
use kvtrace::storage::config::{BackendConfig, EvictionTiming, L2Config, L2Io, StorageConfig};
use kvtrace::storage::eviction::PolicyKind;
use kvtrace::storage::StorageManager;

/// A redis-server child on 127.0.0.1, killed when dropped.
struct Server {
    _child: KillOnDrop,
    port: u16,
    _dir: tempfile::TempDir,
}

fn start() -> Option<Server> {
    start_on(free_port())
}

fn start_on(port: u16) -> Option<Server> {
    if Command::new("redis-server")
        .arg("--version")
        .output()
        .is_err()
    {
        eprintln!("SKIP: redis-server is not installed (apt-get install redis-server)");
        return None;
    }
    let dir = scratch();
    let child = Command::new("redis-server")
        .args([
            "--port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
        ])
        .arg("--dir")
        .arg(dir.path())
        .stdout(Stdio::null())
        .spawn()
        .expect("spawn redis-server");
    let server = Server {
        _child: KillOnDrop(child),
        port,
        _dir: dir,
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if let Ok(client) = redis::Client::open(server.url()) {
            if let Ok(mut c) = client.get_connection() {
                if redis::cmd("PING").query::<String>(&mut c).is_ok() {
                    return Some(server);
                }
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("redis-server did not answer on port {port}");
}

impl Server {
    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/0", self.port)
    }

    fn query<T: redis::FromRedisValue>(&self, cmd: &mut redis::Cmd) -> T {
        let mut c = redis::Client::open(self.url())
            .expect("client")
            .get_connection()
            .expect("conn");
        cmd.query(&mut c).expect("query")
    }
}

fn replay_basic_lru(sm: &mut StorageManager) -> kvtrace::replay::report::ReplayReport {
    replay(&sample("basic_lru"), sm, &ReplayOptions::default(), |_| {}).expect("replay")
}

fn config(url: String, l1_size_bytes: u64) -> StorageConfig {
    let mut c = StorageConfig {
        l1_size_bytes,
        l2: vec![L2Config {
            backend: BackendConfig::Redis {
                url,
                prefix: "kvtrace-test".into(),
            },
            capacity_bytes: None,
            policy: PolicyKind::Lru,
        }],
        ..StorageConfig::default()
    };
    c.eviction.timing = EvictionTiming::Immediate;
    c
}

#[test]
fn a_replay_writes_every_object_through_to_a_real_redis_server() {
    let Some(server) = start() else { return };
    let mut sm = StorageManager::new(config(server.url(), 1 << 30)).expect("connect");
    let r = replay_basic_lru(&mut sm);
    let redis_tier = &r.tiers[1];
    assert_eq!(redis_tier.backend, "redis");
    assert_eq!(
        redis_tier.writes, 13,
        "every admitted object is written through"
    );
    assert_eq!(redis_tier.bytes_written, 13 * 131_072);
    // The server really holds the objects, under hash-derived names, with their full size.
    let keys: Vec<String> = server.query(redis::cmd("KEYS").arg("kvtrace-test:*"));
    assert_eq!(keys.len(), 13);
    assert!(keys.iter().all(|k| k.len() == "kvtrace-test:".len() + 32));
    let len: u64 = server.query(redis::cmd("STRLEN").arg(&keys[0]));
    assert_eq!(len, 131_072);
}

#[test]
fn prefetches_load_what_l1_lost_back_from_redis() {
    let Some(server) = start() else { return };
    let sm = StorageManager::new(config(server.url(), 1 << 30)).expect("connect");
    crate::util::l2_serves_what_l1_lost(sm, |_| {});
}

#[test]
fn the_cli_takes_lmcache_style_resp_adapters() {
    let Some(server) = start() else { return };
    let adapter = format!("{{\"type\":\"resp\",\"url\":\"{}\"}}", server.url());
    let trace = sample("basic_lru").display().to_string();
    let out = kvtrace(["replay", &trace, "--no-csv", "-q", "--l2-adapter", &adapter]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let dbsize: u64 = server.query(&mut redis::cmd("DBSIZE"));
    assert_eq!(dbsize, 13);
}

#[test]
fn an_unreachable_server_is_a_clear_error() {
    let port = free_port();
    let err = StorageManager::new(config(format!("redis://127.0.0.1:{port}/0"), 1 << 30))
        .err()
        .expect("nothing listens there");
    let text = err.to_string();
    assert!(
        text.starts_with("L2[0] tier: redis redis://127.0.0.1:"),
        "{text}"
    );
}

#[test]
fn a_server_that_does_not_speak_resp_is_one_line_and_exit_1() {
    let listener = TcpListener::bind("127.0.0.1:0").expect("port");
    let port = listener.local_addr().expect("addr").port();
    std::thread::spawn(move || {
        use std::io::{Read, Write};
        for stream in listener.incoming().take(4) {
            let Ok(mut s) = stream else { continue };
            let mut buf = [0u8; 256];
            let _ = s.read(&mut buf);
            let _ = s.write_all(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n");
        }
    });
    let adapter = format!("{{\"type\":\"resp\",\"url\":\"redis://127.0.0.1:{port}/0\"}}");
    let sample = sample("basic_lru").display().to_string();
    let out = kvtrace([
        "replay",
        &sample,
        "--l1-size-gb",
        "1",
        "--l2-adapter",
        &adapter,
        "-q",
        "--no-csv",
    ]);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains(&format!("127.0.0.1:{port}")), "{err}");
}

#[test]
fn a_restarted_server_is_reconnected_and_a_dead_one_fails_each_call_in_one_line() {
    use kvtrace::storage::backend::Backend;
    use kvtrace::storage::redis::RedisTier;
    use kvtrace::storage::KeyId;
    let Some(server) = start() else { return };
    let (port, url) = (server.port, server.url());
    let mut tier = RedisTier::connect(&url, "kvtrace-test").expect("connect");
    tier.put(KeyId(1), 16).expect("first store");
    drop(server);
    let restarted = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(150));
        start_on(port)
    });
    tier.put(KeyId(2), 16)
        .expect("the store waits for the restarted server and is sent again");
    let server = restarted.join().expect("thread").expect("restarted");
    let keys: Vec<String> = server.query(redis::cmd("KEYS").arg("kvtrace-test:*"));
    assert_eq!(
        keys.len(),
        1,
        "the restarted server is empty but for the new store"
    );
    drop(server);
    let e = tier.put(KeyId(3), 16).expect_err("no server").to_string();
    assert!(!e.contains('\n'), "{e}");
    assert!(e.contains("not regained after 6 attempts"), "{e}");
}

#[test]
fn failed_stores_are_counted_per_tier() {
    let Some(server) = start() else { return };
    let mut sm = StorageManager::new(config(server.url(), 1 << 30)).expect("connect");
    drop(server);
    let r = replay_basic_lru(&mut sm);
    let redis_tier = &r.tiers[1];
    assert_eq!(redis_tier.writes, 0);
    assert_eq!(redis_tier.resident_objects, 0);
    assert_eq!(
        redis_tier.write_errors, 13,
        "every refused store is counted"
    );
    assert!(r.failed > 0);
}

#[test]
fn asynchronous_io_stores_the_same_objects_and_counts_what_a_dead_server_refused() {
    let Some(server) = start() else { return };
    let mut c = config(server.url(), 1 << 30);
    c.l2_io = L2Io::asynchronous(8, 3).expect("mode");
    let mut sm = StorageManager::new(c.clone()).expect("connect");
    let r = replay_basic_lru(&mut sm);
    assert_eq!((r.tiers[1].writes, r.tiers[1].resident_objects), (13, 13));
    let io = &r.tier_io[0];
    assert_eq!((io.mode.as_str(), io.workers), ("asynchronous", Some(3)));
    assert_eq!(
        (io.calls.writes, io.calls.bytes_written),
        (13, 13 * 131_072)
    );
    // The replay drained the queues: the server holds every object when it returns.
    let keys: Vec<String> = server.query(redis::cmd("KEYS").arg("kvtrace-test:*"));
    assert_eq!(keys.len(), 13);

    let mut sm = StorageManager::new(c).expect("connect");
    drop(server);
    let r = replay_basic_lru(&mut sm);
    let tier = &r.tiers[1];
    assert_eq!(
        tier.write_errors, 13,
        "each refused write counted: {tier:?}"
    );
    assert_eq!(tier.resident_objects, 0, "and dropped from the accounting");
    assert!(
        r.warnings
            .iter()
            .any(|w| w.starts_with("L2[0]: asynchronous calls failed; the first: ")),
        "{:?}",
        r.warnings
    );
}
