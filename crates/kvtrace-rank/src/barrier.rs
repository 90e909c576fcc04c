//! The start barrier: every rank waits here until all have finished their setup, so the
//! measured phases begin together.
//!
//! It meets through a directory every rank can see — the run's output directory on one
//! machine, a shared file system across many — with one file per rank under
//! `.kvtrace-barrier/<run id>/`. A rank announces itself by creating its file (written
//! under a temporary name and renamed, so a file that exists is whole), then waits for the
//! others'. The run id keeps one run's files apart from a previous run's: it comes from the
//! launcher (Open MPI's job id, Slurm's job and step) or `--run-id`, and must be new for
//! every run. A rank that never arrives stops the others after the timeout with one line
//! naming it.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::Rank;
use kvtrace_io::error::{Error, Result};

/// How often a waiting rank looks for the others.
const POLL: Duration = Duration::from_millis(20);

/// A rank's place at the barrier of one run.
#[derive(Clone, Debug)]
pub struct Barrier {
    dir: PathBuf,
    rank: u32,
    world_size: u32,
    timeout: Duration,
}

/// A run id is a directory name: letters, digits and `-_.`, at most 128 characters, not
/// starting with a dot.
fn check_run_id(id: &str) -> Result<()> {
    let ok = !id.is_empty()
        && id.len() <= 128
        && !id.starts_with('.')
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if ok {
        Ok(())
    } else {
        Err(Error::usage(format!(
            "run id {id:?}: expected 1 to 128 letters, digits, '-', '_' or '.', not starting with '.'"
        )))
    }
}

impl Barrier {
    /// The barrier of run `run_id` for `rank`, meeting under `base`.
    pub fn new(base: &Path, run_id: &str, rank: &Rank, timeout: Duration) -> Result<Barrier> {
        check_run_id(run_id)?;
        Ok(Barrier {
            dir: base.join(".kvtrace-barrier").join(run_id),
            rank: rank.rank,
            world_size: rank.world_size,
            timeout,
        })
    }

    fn file_of(&self, rank: u32) -> PathBuf {
        self.dir.join(format!("rank-{rank:05}"))
    }

    /// Announces this rank and returns once every rank has; an error naming the ranks
    /// missing after the timeout, on an interrupt, or when the run id's directory holds this
    /// rank's file already (a run id used before: its files would let a lone rank start).
    /// Each poll lists the directory once, so its cost is the ranks arrived, not the world.
    pub fn wait(&self) -> Result<()> {
        let shown = self.dir.display();
        fs::create_dir_all(&self.dir)
            .map_err(|e| Error::io(format!("start barrier: cannot create {shown}"), e))?;
        let mine = self.file_of(self.rank);
        if mine.exists() {
            return Err(Error::usage(format!(
                "start barrier: {} exists from an earlier run with this run id; use a new run id or remove {shown}",
                mine.display()
            )));
        }
        let staged = mine.with_extension("tmp");
        fs::write(&staged, format!("{}\n", std::process::id()))
            .and_then(|()| fs::rename(&staged, &mine))
            .map_err(|e| Error::io(format!("start barrier: cannot write {}", mine.display()), e))?;
        let began = Instant::now();
        loop {
            let arrived = self.arrived()?;
            if arrived.len() as u64 == u64::from(self.world_size) {
                return Ok(());
            }
            if kvtrace_io::interrupt::requested().is_some() {
                return Err(Error::usage("start barrier: interrupted"));
            }
            if began.elapsed() >= self.timeout {
                return Err(self.timed_out(&arrived));
            }
            std::thread::sleep(POLL);
        }
    }

    /// The ranks whose files are in the directory, sorted.
    fn arrived(&self) -> Result<Vec<u32>> {
        let listing = fs::read_dir(&self.dir).map_err(|e| {
            Error::io(
                format!("start barrier: cannot list {}", self.dir.display()),
                e,
            )
        })?;
        let mut ranks: Vec<u32> = listing
            .filter_map(|entry| {
                let name = entry.ok()?.file_name();
                let rank: u32 = name.to_str()?.strip_prefix("rank-")?.parse().ok()?;
                (rank < self.world_size).then_some(rank)
            })
            .collect();
        ranks.sort_unstable();
        ranks.dedup();
        Ok(ranks)
    }

    fn timed_out(&self, arrived: &[u32]) -> Error {
        const SHOWN: usize = 8;
        let absent = u64::from(self.world_size) - arrived.len() as u64;
        let mut names = Vec::new();
        let mut next = 0u32;
        for &r in arrived.iter().chain([&self.world_size]) {
            let mut m = next;
            while m < r && names.len() < SHOWN {
                names.push(m.to_string());
                m += 1;
            }
            next = r.saturating_add(1);
        }
        if absent > names.len() as u64 {
            names.push(format!("and {} more", absent - names.len() as u64));
        }
        Error::io(
            format!("start barrier in {}", self.dir.display()),
            std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!(
                    "rank(s) {} of {} did not arrive within {:.0} s",
                    names.join(", "),
                    self.world_size,
                    self.timeout.as_secs_f64()
                ),
            ),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rank(rank: u32, world_size: u32) -> Rank {
        Rank {
            rank,
            world_size,
            source: "--rank".into(),
        }
    }

    #[test]
    fn all_ranks_pass_together() {
        let dir = tempfile::tempdir().unwrap();
        let threads: Vec<_> = (0..3)
            .map(|r| {
                let base = dir.path().to_owned();
                std::thread::spawn(move || {
                    Barrier::new(&base, "run-1", &rank(r, 3), Duration::from_secs(20))
                        .unwrap()
                        .wait()
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap().unwrap();
        }
    }

    #[test]
    fn a_missing_rank_is_named_after_the_timeout() {
        let dir = tempfile::tempdir().unwrap();
        let b = Barrier::new(dir.path(), "run-2", &rank(0, 3), Duration::from_millis(100));
        let e = b.unwrap().wait().unwrap_err().to_string();
        assert!(e.contains("rank(s) 1, 2 of 3 did not arrive"), "{e}");
        assert!(!e.contains('\n'), "{e}");
    }

    #[test]
    fn a_huge_world_costs_what_arrived_and_the_timeout_holds() {
        let dir = tempfile::tempdir().unwrap();
        let b = Barrier::new(
            dir.path(),
            "run-3",
            &rank(7, 4_000_000),
            Duration::from_millis(200),
        );
        let began = Instant::now();
        let e = b.unwrap().wait().unwrap_err().to_string();
        assert!(began.elapsed() < Duration::from_secs(5));
        assert!(
            e.contains("rank(s) 0, 1, 2, 3, 4, 5, 6, 8, and 3999991 more of 4000000"),
            "{e}"
        );
    }

    #[test]
    fn a_reused_run_id_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let lone = |r| Barrier::new(dir.path(), "again", &rank(r, 1), Duration::from_secs(5));
        lone(0).unwrap().wait().unwrap();
        let e = lone(0).unwrap().wait().unwrap_err().to_string();
        assert!(e.contains("exists from an earlier run"), "{e}");
    }

    #[test]
    fn a_run_id_never_becomes_a_path_outside_the_barrier() {
        let dir = tempfile::tempdir().unwrap();
        for bad in ["../x", "a/b", ".hidden", "", "x y"] {
            let r = Barrier::new(dir.path(), bad, &rank(0, 2), Duration::ZERO);
            assert!(r.is_err(), "{bad:?}");
        }
    }
}
