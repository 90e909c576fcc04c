//! The StorageManager's state machine, call by call.

use super::config::{BackendConfig, EvictionTiming, L2Config, PrefetchPolicy, StorageConfig};
use super::eviction::PolicyKind;
use super::{CallError, KeyId, StorageManager, TierIo, Traced};
use crate::bus::Tracer;
use kvtrace_lmct::codec::{LockMode, MemoryLayoutDesc, ObjectKey, PrefetchTaskSpec};

/// 1000-byte objects: `[2, 1, 250, 1]` of float16.
fn layout() -> MemoryLayoutDesc {
    MemoryLayoutDesc {
        shapes: vec![vec![2, 1, 250, 1]],
        dtypes: vec!["torch.float16".into()],
    }
}

fn keys(range: std::ops::Range<u8>) -> Vec<ObjectKey> {
    range
        .map(|i| ObjectKey {
            chunk_hash: vec![i; 32],
            model_name: "m".into(),
            kv_rank: 16_777_472,
            object_group_id: 0,
            cache_salt: String::new(),
        })
        .collect()
}

fn spec(keys: &[ObjectKey], policy: &str, lock: LockMode) -> PrefetchTaskSpec {
    PrefetchTaskSpec::single_group(keys.to_vec(), layout(), policy, lock)
}

/// The tests' objects are 1000 bytes: an 8-byte alignment keeps L1 sizes in whole objects.
const ALIGN: u64 = 8;

fn manager(capacity: u64, timing: EvictionTiming) -> Traced {
    let mut config = StorageConfig {
        l1_size_bytes: capacity,
        l1_align_bytes: ALIGN,
        ..StorageConfig::default()
    };
    config.eviction.timing = timing;
    StorageManager::new(config)
        .map(|m| Traced::new(m, Tracer::disabled()))
        .expect("manager")
}

fn store(sm: &mut Traced, k: &[ObjectKey]) {
    sm.reserve_write(k, &layout());
    sm.finish_write(k).expect("finish");
}

#[test]
fn reserved_objects_are_invisible_until_finished_and_not_writable_twice() {
    let mut sm = manager(10_000, EvictionTiming::Immediate);
    let k = keys(0..3);
    let r = sm.reserve_write(&k, &layout());
    assert_eq!(
        (r.reserved.len(), r.not_writable, r.out_of_memory),
        (3, 0, false)
    );
    assert!(!sm.manager().is_resident(KeyId::of(&k[0])));
    let hit = sm
        .submit_prefetch_task(&spec(&k, "prefix", LockMode::Lock), "r", false)
        .expect("ok");
    assert_eq!(hit.hit_chunks, 0, "staged objects are not readable");
    assert_eq!(
        sm.reserve_write(&k, &layout()).not_writable,
        3,
        "staged: KEY_NOT_WRITABLE"
    );
    assert_eq!(sm.finish_write(&k).expect("ok").len(), 3);
    assert!(sm.manager().is_resident(KeyId::of(&k[2])));
    assert_eq!(
        sm.reserve_write(&k[..1], &layout()).not_writable,
        1,
        "resident: KEY_NOT_WRITABLE"
    );
    assert!(sm.finish_write(&keys(9..10)).expect("ok").is_empty());
    assert_eq!(sm.manager().call_stats().keys_not_staged, 1);
}

#[test]
fn a_batch_that_does_not_fit_is_out_of_memory_as_a_whole() {
    let mut sm = manager(
        2_500,
        EvictionTiming::Periodic {
            interval_s: 1.0,
            phase_s: 0.0,
        },
    );
    let r = sm.reserve_write(&keys(0..3), &layout());
    assert!(r.out_of_memory);
    assert!(r.reserved.is_empty(), "partial allocations are not kept");
    assert_eq!(sm.reserve_write(&keys(0..2), &layout()).reserved.len(), 2);
    assert_eq!(sm.manager().call_stats().out_of_memory_keys, 3);
}

#[test]
fn locked_objects_survive_eviction_pressure_and_become_evictable_when_released() {
    let mut sm = manager(3_000, EvictionTiming::Immediate);
    let first = keys(0..2);
    store(&mut sm, &first);
    sm.submit_prefetch_task(&spec(&first, "prefix", LockMode::Lock), "r", false)
        .expect("ok");
    // Room for one more only if the locked pair stays: the next write must not evict it.
    let r = sm.reserve_write(&keys(10..12), &layout());
    assert!(r.out_of_memory);
    assert!(sm.read_prefetched_enter(&first).is_ok());
    sm.read_prefetched_exit(&first, true);
    sm.finish_read_prefetched(&first, 1);
    let r = sm.reserve_write(&keys(10..12), &layout());
    assert_eq!(
        r.reserved.len(),
        2,
        "released objects were evicted to make room"
    );
    // A request's tail goes before its prefix (LMCache applies batches last key first).
    assert!(!sm.manager().is_resident(KeyId::of(&first[1])));
    assert!(sm.manager().is_resident(KeyId::of(&first[0])));
}

/// LMCache checks residency before it allocates: a resident key of the batch is not
/// writable even when the room immediate eviction makes for the rest takes it.
#[test]
fn a_batch_key_evicted_to_make_room_stays_not_writable_and_the_rest_fit() {
    let mut sm = manager(4_000, EvictionTiming::Immediate);
    store(&mut sm, &keys(0..2));
    let batch: Vec<ObjectKey> = keys(0..1).into_iter().chain(keys(10..14)).collect();
    let r = sm.reserve_write(&batch, &layout());
    assert_eq!(
        (r.reserved.len(), r.not_writable, r.out_of_memory),
        (4, 1, false)
    );
    assert_eq!(sm.manager().call_stats().out_of_memory_keys, 0);
}

#[test]
fn reads_need_a_prefetch_lock_and_a_failed_read_releases_one() {
    let mut sm = manager(10_000, EvictionTiming::Immediate);
    let k = keys(0..2);
    store(&mut sm, &k);
    assert_eq!(
        sm.read_prefetched_enter(&k),
        Err(CallError::NotReadable {
            missing: 0,
            unlocked: 2
        })
    );
    sm.submit_prefetch_task(&spec(&k[..1], "prefix", LockMode::Lock), "r", false)
        .expect("ok");
    let mut both = k.clone();
    both.extend(keys(5..6));
    assert_eq!(
        sm.read_prefetched_enter(&both),
        Err(CallError::NotReadable {
            missing: 1,
            unlocked: 1
        })
    );
    sm.read_prefetched_exit(&both, false);
    assert!(
        sm.read_prefetched_enter(&k[..1]).is_err(),
        "the failed read released the lock"
    );
}

#[test]
fn prefix_stops_at_the_first_miss_and_full_keeps_every_hit() {
    let mut sm = manager(10_000, EvictionTiming::Immediate);
    let k = keys(0..4);
    store(&mut sm, &[k[0].clone(), k[2].clone(), k[3].clone()]);
    let p = sm
        .submit_prefetch_task(&spec(&k, "prefix", LockMode::NoLock), "p", false)
        .expect("ok");
    assert_eq!((p.requested_chunks, p.hit_chunks), (4, 1));
    let f = sm
        .submit_prefetch_task(&spec(&k, "full", LockMode::NoLock), "f", false)
        .expect("ok");
    assert_eq!(f.hit_chunks, 3);
    assert!(
        sm.read_prefetched_enter(&k[..1]).is_err(),
        "NO_LOCK takes no read locks"
    );
}

#[test]
fn read_locks_and_reservations_expire_with_their_ttls() {
    let mut sm = manager(10_000, EvictionTiming::Immediate);
    let k = keys(0..1);
    store(&mut sm, &k);
    sm.submit_prefetch_task(&spec(&k, "prefix", LockMode::Lock), "r", false)
        .expect("ok");
    sm.reserve_write(&keys(1..2), &layout());
    sm.manager_mut().advance_to(301.0);
    assert!(
        sm.read_prefetched_enter(&k).is_err(),
        "read lock expired after 300 s"
    );
    assert_eq!(sm.manager().call_stats().read_locks_expired, 1);
    sm.manager_mut().advance_to(601.0);
    // The lapsed reservation's buffer goes to the next writer of the key.
    assert_eq!(sm.reserve_write(&keys(1..2), &layout()).reserved.len(), 1);
    assert_eq!(sm.manager().call_stats().write_reservations_expired, 1);
}

#[test]
fn l2_loads_are_dropped_after_use_unless_retained() {
    for (policy, stays) in [
        (PrefetchPolicy::Default, false),
        (PrefetchPolicy::Retain, true),
    ] {
        let mut config = StorageConfig {
            l1_size_bytes: 1_000,
            l1_align_bytes: ALIGN,
            prefetch_policy: policy,
            l2: vec![L2Config {
                backend: BackendConfig::Memory { buffers: true },
                capacity_bytes: None,
                policy: PolicyKind::Lru,
            }],
            ..StorageConfig::default()
        };
        config.eviction.timing = EvictionTiming::Immediate;
        let mut sm = StorageManager::new(config)
            .map(|m| Traced::new(m, Tracer::disabled()))
            .expect("manager");
        let (a, b) = (keys(0..1), keys(1..2));
        store(&mut sm, &a);
        store(&mut sm, &b); // evicts a from L1; L2 still has it
        assert!(!sm.manager().is_resident(KeyId::of(&a[0])));
        let o = sm
            .submit_prefetch_task(&spec(&a, "prefix", LockMode::Lock), "r", false)
            .expect("ok");
        assert_eq!((o.l1_hit_chunks, o.l2_hit_chunks), (0, 1));
        sm.finish_read_prefetched(&a, 1);
        assert_eq!(sm.manager().is_resident(KeyId::of(&a[0])), stays);
        let skip = sm
            .submit_prefetch_task(&spec(&b, "prefix", LockMode::Lock), "s", true)
            .expect("ok");
        assert_eq!(skip.l2_hit_chunks, 0);
    }
}

#[test]
fn a_hostile_layout_size_is_refused_not_overflowed() {
    let mut sm = manager(10_000, EvictionTiming::Immediate);
    let huge = MemoryLayoutDesc {
        shapes: vec![vec![1 << 31, 1 << 31, 1 << 20]],
        dtypes: vec!["torch.float64".into()],
    };
    assert_eq!(
        huge.object_bytes(),
        None,
        "overflowing sizes are unknown, not wrapped"
    );
    // One object of 2^62 bytes is representable; eight of them overflow u64 and saturate.
    let big = MemoryLayoutDesc {
        shapes: vec![vec![1 << 30, 1 << 29]],
        dtypes: vec!["torch.float64".into()],
    };
    assert_eq!(big.object_bytes(), Some(1 << 62));
    let r = sm.reserve_write(&keys(0..8), &big);
    assert!(r.out_of_memory, "8 objects of 2^62 bytes do not fit");
}

/// MLPerf's leak scenario: 40 entries that fit in the hierarchy as a whole pass through a
/// small L1 and a bounded middle tier; every one must survive and be found again.
#[test]
fn waterfall_keeps_every_entry_that_fits_and_drops_only_from_the_last_tier() {
    use super::config::Placement;
    let dir = tempfile::tempdir().expect("tmp");
    let tier = |backend, capacity_bytes| L2Config {
        backend,
        capacity_bytes,
        policy: PolicyKind::Lru,
    };
    let mut config = StorageConfig {
        l1_size_bytes: 4_000,
        l1_align_bytes: ALIGN,
        placement: Placement::Waterfall,
        l2: vec![
            tier(BackendConfig::Memory { buffers: true }, Some(10_000)),
            tier(
                BackendConfig::File {
                    dir: dir.path().to_path_buf(),
                    direct: false,
                    fsync: super::file::FsyncPolicy::Never,
                },
                Some(40_000),
            ),
        ],
        ..StorageConfig::default()
    };
    config.eviction.timing = EvictionTiming::Immediate;
    let mut sm = StorageManager::new(config)
        .map(|m| Traced::new(m, Tracer::disabled()))
        .expect("manager");
    let all = keys(0..40);
    for k in all.chunks(1) {
        store(&mut sm, k);
    }
    let calls = sm.manager().call_stats().clone();
    assert_eq!(calls.dropped_from_last_tier, 0);
    let tiers = sm.manager().tier_stats();
    let resident: u64 = tiers.iter().map(|t| t.resident_objects).sum();
    assert_eq!(resident, 40, "every entry is somewhere");
    assert!(
        tiers[1].resident_bytes <= 8_000,
        "the middle tier stays under 80 %"
    );
    assert!(
        tiers[2].bytes_written > 0,
        "demotions reach the last tier and are counted"
    );
    assert_eq!(
        calls.demotions,
        tiers[1].writes + tiers[2].writes,
        "each move is a write below"
    );
    assert_eq!(tiers[1].bytes_written, tiers[1].writes * 1000);
    for k in all.chunks(1) {
        let hit = sm
            .submit_prefetch_task(
                &PrefetchTaskSpec::single_group(k.to_vec(), layout(), "prefix", LockMode::Lock),
                "r",
                false,
            )
            .expect("prefetch");
        assert_eq!(hit.hit_chunks, 1, "entry {:?} lost", k[0].chunk_hash[0]);
        sm.finish_read_prefetched(k, 1);
    }
    // More than the 52 that fit (4 in L1, 8 under the middle tier's 80 %, 40 below): the
    // overflow leaves from the last tier only.
    for k in keys(40..60).chunks(1) {
        store(&mut sm, k);
    }
    assert!(sm.manager().call_stats().dropped_from_last_tier > 0);
}

/// A GPU → CPU waterfall on a machine without a GPU: the GPU tier holds its budget, and every
/// transfer costs exactly `size / bandwidth`, so two runs report the same I/O time.
#[test]
fn a_gpu_budget_tier_charges_modelled_transfer_time() {
    use super::config::Placement;
    let run = || {
        let mut config = StorageConfig {
            l1_size_bytes: 3_000,
            l1_align_bytes: ALIGN,
            l1_gpu_bandwidth_gbps: Some(1e-3), // 1 MB/s: 1 ms per 1000-byte object
            placement: Placement::Waterfall,
            l2: vec![L2Config {
                backend: BackendConfig::Gpu {
                    bandwidth_gbps: 2e-3,
                },
                capacity_bytes: Some(100_000),
                policy: PolicyKind::Lru,
            }],
            ..StorageConfig::default()
        };
        config.eviction.timing = EvictionTiming::Immediate;
        let mut sm = StorageManager::new(config)
            .map(|m| Traced::new(m, Tracer::disabled()))
            .expect("manager");
        for k in keys(0..5).chunks(1) {
            store(&mut sm, k);
        }
        let o = sm
            .submit_prefetch_task(&spec(&keys(0..1), "prefix", LockMode::Lock), "r", false)
            .expect("prefetch");
        assert_eq!(o.l2_hit_chunks, 1, "the demoted entry is found below");
        sm.read_prefetched_enter(&keys(0..1)).expect("read");
        (sm.manager().tier_stats(), sm.manager().tier_io())
    };
    let (stats, io) = run();
    assert_eq!(stats[0].backend, "gpu (budget)");
    assert_eq!(io.len(), 2, "L1 is listed because its time is modelled");
    let l1_writes = stats[0].bytes_written as f64 / 1e6;
    assert!((io[0].write_seconds - l1_writes).abs() < 1e-12);
    assert!((io[0].read_seconds - stats[0].bytes_read as f64 / 1e6).abs() < 1e-12);
    assert!((io[1].write_seconds - stats[1].bytes_written as f64 / 2e6).abs() < 1e-12);
    assert!(
        (io[1].mean_load_ms - 0.5).abs() < 1e-9,
        "1000 bytes at 2 MB/s"
    );
    // The tier's busy span (and the MiB/s over it) is wall time between calls: live.
    let modelled = |mut io: Vec<TierIo>| {
        for t in &mut io {
            (t.calls.span_s, t.calls.mib_per_s) = (0.0, 0.0);
        }
        io
    };
    assert_eq!(
        modelled(run().1),
        modelled(io),
        "modelled time is reproducible"
    );
}

#[test]
fn a_key_id_stands_for_every_field_whatever_keys_came_before() {
    let base = ObjectKey::single_rank(vec![1; 32], "model");
    let variants = {
        let mut v = vec![base.clone()];
        let mut k = base.clone();
        k.chunk_hash[31] = 2;
        v.push(k);
        let mut k = base.clone();
        k.model_name = "model2".into();
        v.push(k);
        // Names of the same length, differing in one byte: first, middle, last.
        for name in ["nodel", "mndel", "modem"] {
            let mut k = base.clone();
            k.model_name = name.into();
            v.push(k);
        }
        let mut k = base.clone();
        k.cache_salt = "salt".into();
        v.push(k);
        let mut k = base.clone();
        k.cache_salt = "salu".into();
        v.push(k);
        // The fields' boundaries count: the name's last byte moved into the salt.
        let mut k = base.clone();
        k.model_name = "mode".into();
        k.cache_salt = "l".into();
        v.push(k);
        let mut k = base.clone();
        k.kv_rank = 1;
        v.push(k);
        let mut k = base.clone();
        k.object_group_id = 1;
        v.push(k);
        v
    };
    let ids: Vec<KeyId> = variants.iter().map(KeyId::of).collect();
    for (i, a) in ids.iter().enumerate() {
        for b in &ids[i + 1..] {
            assert_ne!(a, b);
        }
    }
    // The same key gives the same id in any order and on any thread.
    let reversed: Vec<KeyId> = variants.iter().rev().map(KeyId::of).collect();
    assert_eq!(ids, reversed.into_iter().rev().collect::<Vec<_>>());
    let elsewhere = std::thread::spawn(move || KeyId::of(&variants[6])).join();
    assert_eq!(elsewhere.unwrap(), ids[6]);
}

/// A `u64` key hashes to what its bytes did before `write_u64` took it in one step: the
/// simulator's block maps (their iteration order among them) stay as they were.
#[test]
fn a_u64_key_hashes_as_its_bytes_did() {
    use std::hash::Hasher;
    for n in [0u64, 1, 0x9e37_79b9_7f4a_7c15, u64::MAX, 1 << 63] {
        let (mut whole, mut bytes) = (super::KeyIdHasher::default(), super::KeyIdHasher::default());
        for h in [&mut whole, &mut bytes] {
            h.write(b"seed!");
        }
        whole.write_u64(n);
        bytes.write(&n.to_ne_bytes());
        assert_eq!(whole.finish(), bytes.finish(), "{n:#x}");
    }
}

#[test]
fn fields_compare_equal_only_when_every_byte_is() {
    let text = b"meta-llama/Llama-3.1-8B-Instruct, and a salt";
    for len in 0..text.len() {
        let a = &text[..len];
        let copy = a.to_vec();
        assert!(super::same_bytes(a, &copy), "{len} bytes");
        assert!(
            !super::same_bytes(a, &text[..len + 1]),
            "{len} against {} bytes",
            len + 1
        );
        for at in 0..len {
            let mut b = a.to_vec();
            b[at] ^= 0x20;
            assert!(!super::same_bytes(a, &b), "{len} bytes, byte {at} differs");
        }
    }
}

#[test]
fn a_calls_keys_read_in_place_have_their_owned_copies_ids() {
    use kvtrace_lmct::codec::ObjectKeyRef;
    // The fields around the chunk hash change within the call, and back, so the seed the
    // call's keys share must follow them.
    let owned: Vec<ObjectKey> = [
        ("m-a", 0, 0, ""),
        ("m-a", 0, 0, ""),
        ("m-b", 0, 0, ""),
        ("m-a", 1, 0, ""),
        ("m-a", 1, 3, ""),
        ("m-a", 1, 3, "salt"),
        ("m-a", 0, 0, ""),
    ]
    .iter()
    .enumerate()
    .map(|(i, &(model, rank, group, salt))| ObjectKey {
        chunk_hash: vec![i as u8; 32],
        model_name: model.to_owned(),
        kv_rank: rank,
        object_group_id: group,
        cache_salt: salt.to_owned(),
    })
    .collect();
    let refs: Vec<ObjectKeyRef<'_>> = owned
        .iter()
        .map(|k| ObjectKeyRef {
            chunk_hash: &k.chunk_hash,
            model_name: &k.model_name,
            kv_rank: k.kv_rank,
            object_group_id: k.object_group_id,
            cache_salt: (!k.cache_salt.is_empty()).then_some(k.cache_salt.as_str()),
        })
        .collect();
    let mut ids = vec![KeyId(7)];
    KeyId::of_refs(&refs, &mut ids);
    let expected: Vec<KeyId> = std::iter::once(KeyId(7))
        .chain(owned.iter().map(KeyId::of))
        .collect();
    assert_eq!(
        ids, expected,
        "appended after what was there, each its owned copy's id"
    );
    let distinct: std::collections::HashSet<u128> = ids[1..].iter().map(|id| id.0).collect();
    assert_eq!(distinct.len(), owned.len());
}

/// A recorded configuration that is not one says why: a damaged header is told from one
/// without LMCache's L1 fields, and each missing field is named.
#[test]
fn a_recorded_configuration_that_is_none_says_why() {
    let why = |text: &str| StorageConfig::read_lmcache_json(text).err();
    assert_eq!(why(" ").as_deref(), Some("empty"));
    assert!(why("{\"l1_manager_config\": ").is_some_and(|w| w.starts_with("not JSON (EOF")));
    assert_eq!(why("{}").as_deref(), Some("no l1_manager_config"));
    assert_eq!(
        why("{\"l1_manager_config\": {}}").as_deref(),
        Some("no l1_manager_config.memory_config")
    );
    let memory = |size: &str| {
        format!(
            "{{\"l1_manager_config\": {{\"memory_config\": {{\"size_in_bytes\": {size}}}, \
             \"eviction\": {{}}}}}}"
        )
    };
    assert_eq!(
        why(&memory("-1")).as_deref(),
        Some("no unsigned l1_manager_config.memory_config.size_in_bytes")
    );
    let (config, _) = StorageConfig::read_lmcache_json(&memory("4096")).expect("a configuration");
    assert_eq!(config.l1_size_bytes, 4096);
}
