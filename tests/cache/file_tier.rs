//! The file tier: real files named from key hashes, hostile keys, O_DIRECT, and the errors a
//! user meets (an unusable directory, a full disk).

use std::path::Path;
use std::process::Command;

use crate::util::{kvtrace, sample, scratch, text};
use kvtrace::bus::Tracer;
use kvtrace::lmct::codec::{LockMode, MemoryLayoutDesc, ObjectKey, PrefetchTaskSpec};
use kvtrace::storage::config::{BackendConfig, EvictionTiming, L2Config, StorageConfig};
use kvtrace::storage::eviction::PolicyKind;
use kvtrace::storage::file::FsyncPolicy;
use kvtrace::storage::{StorageManager, Traced};

fn layout() -> MemoryLayoutDesc {
    MemoryLayoutDesc {
        shapes: vec![vec![2, 1, 1000, 3]],
        dtypes: vec!["torch.bfloat16".into()],
    }
}

fn manager(dir: &Path, direct: bool) -> kvtrace::Result<Traced> {
    let mut config = StorageConfig {
        l1_size_bytes: 24_000,
        l1_align_bytes: 8,
        l2: vec![L2Config {
            backend: BackendConfig::File {
                dir: dir.to_path_buf(),
                direct,
                fsync: FsyncPolicy::EveryWrite,
            },
            capacity_bytes: None,
            policy: PolicyKind::Lru,
        }],
        ..StorageConfig::default()
    };
    config.eviction.timing = EvictionTiming::Immediate;
    StorageManager::new(config).map(|m| Traced::new(m, Tracer::disabled()))
}

fn hostile_keys() -> Vec<ObjectKey> {
    let names = [
        "../../../../etc/passwd",
        "a\0b/c",
        &"x".repeat(4096),
        "/abs/path",
        "ok",
    ];
    names
        .iter()
        .enumerate()
        .map(|(i, name)| ObjectKey {
            chunk_hash: format!("../{i}/\0..").into_bytes(),
            model_name: name.to_string(),
            kv_rank: 16_777_472,
            object_group_id: 0,
            cache_salt: "../salt".into(),
        })
        .collect()
}

fn all_files(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).expect("dir") {
        let path = entry.expect("entry").path();
        if path.is_dir() {
            out.extend(all_files(&path));
        } else {
            out.push(path);
        }
    }
    out
}

fn round_trip(dir: &Path, direct: bool) -> kvtrace::Result<()> {
    let mut sm = manager(dir, direct)?;
    let keys = hostile_keys();
    for k in &keys {
        let one = std::slice::from_ref(k);
        sm.reserve_write(one, &layout());
        sm.finish_write(one)
            .map_err(|e| kvtrace::Error::usage(e.to_string()))?;
    }
    // L1 holds two 12 000-byte objects: the first keys it evicted come back from the files.
    let first = keys[..2].to_vec();
    let spec = PrefetchTaskSpec::single_group(first, layout(), "full", LockMode::NoLock);
    let hit = sm
        .submit_prefetch_task(&spec, "r", false)
        .map_err(|e| kvtrace::Error::usage(e.to_string()))?;
    assert_eq!((hit.hit_chunks, hit.l2_hit_chunks), (2, 2));
    let tiers = sm.manager().tier_stats();
    assert_eq!(tiers[1].bytes_written, 5 * 12_000);
    assert_eq!(tiers[1].bytes_read, 2 * 12_000);
    Ok(())
}

#[test]
fn hostile_keys_never_leave_the_directory() {
    let dir = scratch();
    let tier = dir.path().join("tier");
    round_trip(&tier, false).expect("file tier");
    let files = all_files(&tier);
    assert_eq!(files.len(), 5);
    for f in files {
        let name = f.file_name().and_then(|n| n.to_str()).expect("name");
        assert!(f.starts_with(&tier), "{}", f.display());
        assert_eq!(name.len(), 35, "{name}");
        assert!(name.ends_with(".kv") && name[..32].chars().all(|c| c.is_ascii_hexdigit()));
        assert_eq!(std::fs::metadata(&f).expect("meta").len(), 12_000);
    }
    assert!(all_files(dir.path()).iter().all(|f| f.starts_with(&tier)));
}

#[test]
fn direct_io_writes_aligned_files_and_reads_them_back() {
    // Inside the build directory: on a real filesystem, where O_DIRECT is supported (tmpfs
    // does not support it).
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("tmp");
    match round_trip(dir.path(), true) {
        Ok(()) => {}
        Err(e) if e.to_string().contains("Invalid argument") => {
            eprintln!("SKIP: this filesystem does not support O_DIRECT: {e}");
            return;
        }
        Err(e) => panic!("{e}"),
    }
    for f in all_files(dir.path()) {
        assert_eq!(
            std::fs::metadata(&f).expect("meta").len() % 4096,
            0,
            "padded to 4 KiB"
        );
    }
}

#[test]
fn an_unusable_directory_is_a_clear_error() {
    let dir = scratch();
    let file = dir.path().join("plain-file");
    std::fs::write(&file, b"x").expect("write");
    let err = manager(&file.join("tier"), false)
        .err()
        .expect("not a directory");
    let message = err.to_string();
    assert!(message.starts_with("L2[0] tier: "), "{message}");
    assert!(message.contains("plain-file/tier"), "{message}");
    let adapter = format!(
        "{{\"type\":\"fs\",\"path\":\"{}\"}}",
        file.join("tier").display()
    );
    let trace = sample("basic_lru").display().to_string();
    let out = kvtrace(["replay", &trace, "--no-csv", "-q", "--l2-adapter", &adapter]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = text(&out.stderr);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains("L2[0] tier"), "{stderr}");
}

#[test]
fn a_full_disk_fails_the_calls_cleanly() {
    // RLIMIT_FSIZE makes writes past 40 KiB fail with EFBIG, as a full disk fails them with
    // ENOSPC; SIGXFSZ is ignored so the write returns an error instead of killing kvtrace.
    let dir = scratch();
    let script = format!(
        "trap '' XFSZ; ulimit -f 40; exec '{}' replay '{}' --no-csv -q --l2-adapter '{{\"type\":\"fs\",\"path\":\"{}\"}}' --jsonl-out '{}'",
        env!("CARGO_BIN_EXE_kvtrace"),
        sample("basic_lru").display(),
        dir.path().join("tier").display(),
        dir.path().join("r.jsonl").display(),
    );
    let out = Command::new("bash")
        .arg("-c")
        .arg(script)
        .output()
        .expect("bash");
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    // The count line says why, with the key in the file's name left out so that failures of
    // one kind are counted together.
    let err = text(&out.stderr);
    let why = format!(
        " × tier I/O failed: {}/KEY.kv: File too large (os error N)",
        dir.path().join("tier").display()
    );
    assert!(
        err.contains("call(s) failed: ") && err.contains(&why),
        "{err}"
    );
    let lines = std::fs::read_to_string(dir.path().join("r.jsonl")).expect("jsonl");
    let failed: Vec<&str> = lines
        .lines()
        .filter(|l| l.contains("\"outcome\":\"failed\""))
        .collect();
    assert!(!failed.is_empty());
    assert!(
        failed[0].contains("tier I/O failed") && failed[0].contains("File too large"),
        "{}",
        failed[0]
    );
}
