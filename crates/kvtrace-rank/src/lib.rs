//! Rank mode: one kvtrace process of many, started by a launcher users already run —
//! `mpirun` (Open MPI, MPICH), `srun`, a Kubernetes indexed Job — or by hand with
//! `--rank/--world-size`. No MPI library is linked: the launcher's environment says which
//! process this is, and the ranks meet at a [`barrier`] before the measured phase.
//!
//! Each rank derives what must differ between ranks from its number: its seed (base +
//! rank), its output directory ([`Rank::dir_name`]) and its share of a trace
//! (`kvtrace::replay::shard`); every output carries the rank so per-rank files merge back
//! (`kvtrace aggregate`).

#![warn(unreachable_pub)]

pub mod aggregate;
pub mod barrier;

use std::path::{Path, PathBuf};

use serde::Serialize;

use kvtrace_io::error::{Error, Result};
use kvtrace_io::{error, interrupt};
use kvtrace_lmct as lmct;
use kvtrace_report as report;

/// Where a rank learnt its number: the launcher's variables, in the order they are
/// consulted. A Kubernetes indexed Job gives only the index; its size comes from
/// `--world-size`.
pub const LAUNCHERS: [(&str, &str, Option<&str>); 4] = [
    (
        "Open MPI",
        "OMPI_COMM_WORLD_RANK",
        Some("OMPI_COMM_WORLD_SIZE"),
    ),
    ("MPICH (PMI)", "PMI_RANK", Some("PMI_SIZE")),
    ("Slurm", "SLURM_PROCID", Some("SLURM_NTASKS")),
    ("Kubernetes indexed Job", "JOB_COMPLETION_INDEX", None),
];

/// This process's place in a run of many.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Rank {
    pub rank: u32,
    pub world_size: u32,
    /// What said so: a launcher's variable, or the name of the caller's rank setting.
    pub source: String,
}

/// What a caller was given about the rank (by flags, a configuration, its own code), and
/// the names it gives those two settings: the messages and a rank's source use them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Given<'a> {
    pub rank: Option<u32>,
    pub world_size: Option<u32>,
    pub rank_name: &'a str,
    pub world_size_name: &'a str,
}

fn number(name: &str, text: &str) -> Result<u32> {
    text.trim().parse().map_err(|_| {
        Error::usage(format!(
            "{name}={text:?}: expected a rank number (0 or more)"
        ))
    })
}

impl Rank {
    /// The rank `given`, else from the first launcher whose rank variable `env` has;
    /// `None` for a process started on its own (nothing given, no launcher). What is given
    /// wins over the environment, so a rank can be pinned under any launcher.
    pub fn detect(given: &Given<'_>, env: impl Fn(&str) -> Option<String>) -> Result<Option<Rank>> {
        let (rank, world_size, source) = match (given.rank, given.world_size) {
            (Some(rank), world) => (rank, world, given.rank_name.to_owned()),
            (None, world) => {
                let Some((launcher, rank_var, size_var, text)) = LAUNCHERS
                    .iter()
                    .find_map(|&(l, r, s)| env(r).map(|text| (l, r, s, text)))
                else {
                    return match world {
                        Some(n) if n > 1 => Err(Error::usage(format!(
                            "{} {n} needs {} or a launcher's rank variable ({})",
                            given.world_size_name,
                            given.rank_name,
                            LAUNCHERS.map(|l| l.1).join(", ")
                        ))),
                        _ => Ok(None),
                    };
                };
                let rank = number(rank_var, &text)?;
                let size = match (world, size_var.and_then(|v| env(v).map(|t| (v, t)))) {
                    (Some(n), _) => Some(n),
                    (None, Some((var, text))) => Some(number(var, &text)?),
                    (None, None) => None,
                };
                (rank, size, format!("{rank_var} ({launcher})"))
            }
        };
        let Some(world_size) = world_size else {
            return Err(Error::usage(format!(
                "rank {rank} from {source}: the world size is unknown; give {}",
                given.world_size_name
            )));
        };
        if world_size == 0 || rank >= world_size {
            return Err(Error::usage(format!(
                "rank {rank} from {source} is not below the world size {world_size}"
            )));
        }
        Ok(Some(Rank {
            rank,
            world_size,
            source,
        }))
    }

    /// This rank's seed: the run's base seed plus the rank, so ranks draw different
    /// workloads and a run is reproducible for a given world size.
    pub fn seed(&self, base: u64) -> u64 {
        base.wrapping_add(u64::from(self.rank))
    }

    /// The directory a rank's outputs (and its private cache files) go to, under the
    /// directory the run was given: `rank-00003`. Five digits sort up to 100,000 ranks.
    pub fn dir_name(&self) -> String {
        format!("rank-{:05}", self.rank)
    }

    /// A rank's name for a per-run file: `records.jsonl` becomes `records.rank-00002.jsonl`.
    pub fn file_name(&self, path: &Path) -> PathBuf {
        let stem = path.file_stem().unwrap_or_default().to_string_lossy();
        let name = match path.extension() {
            Some(ext) => format!("{stem}.{}.{}", self.dir_name(), ext.to_string_lossy()),
            None => format!("{stem}.{}", self.dir_name()),
        };
        path.with_file_name(name)
    }
}

/// The launcher's identifier of this run, when it gives one: what makes a barrier's files
/// this run's and not a previous one's.
///
/// The id is made a valid run id (a directory name: see the barrier) whatever the variables
/// hold: other characters become `_`, and an id past 128 characters is cut, with a hash of the
/// whole so that two long ids stay apart.
pub fn launcher_run_id(env: impl Fn(&str) -> Option<String>) -> Option<String> {
    let id = if let Some(job) = env("OMPI_MCA_ess_base_jobid") {
        format!("ompi-{job}")
    } else if let Some(job) = env("SLURM_JOB_ID") {
        let step = env("SLURM_STEP_ID").unwrap_or_default();
        format!("slurm-{job}.{step}")
    } else {
        format!("pmi-{}", env("PMI_KVSNAME")?)
    };
    Some(directory_name(&id))
}

/// `id` with every character but letters, digits and `-_.` replaced by `_`, at most 128
/// characters (a longer one ends in a hash of the whole).
fn directory_name(id: &str) -> String {
    const MAX: usize = 128;
    let clean: String = id
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') {
                c
            } else {
                '_'
            }
        })
        .collect();
    if clean.len() <= MAX {
        return clean;
    }
    // FNV-1a: stable across builds, unlike the standard library's hasher.
    let hash = id.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    });
    format!("{}-{hash:016x}", &clean[..MAX - 17])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |name| pairs.iter().find(|p| p.0 == name).map(|p| p.1.to_owned())
    }

    fn given(rank: Option<u32>, world_size: Option<u32>) -> Given<'static> {
        Given {
            rank,
            world_size,
            rank_name: "--rank",
            world_size_name: "--world-size",
        }
    }

    fn detect(given: Given<'_>, pairs: &[(&str, &str)]) -> Result<Option<Rank>> {
        Rank::detect(&given, env(pairs))
    }

    #[test]
    fn each_launcher_names_the_rank_and_the_world() {
        for (vars, rank, size) in [
            (
                [("OMPI_COMM_WORLD_RANK", "3"), ("OMPI_COMM_WORLD_SIZE", "4")],
                3,
                4,
            ),
            ([("PMI_RANK", "1"), ("PMI_SIZE", "2")], 1, 2),
            ([("SLURM_PROCID", "0"), ("SLURM_NTASKS", "8")], 0, 8),
        ] {
            let r = detect(given(None, None), &vars).unwrap().unwrap();
            assert_eq!((r.rank, r.world_size), (rank, size), "{vars:?}");
            assert!(r.source.starts_with(vars[0].0), "{}", r.source);
        }
    }

    #[test]
    fn a_launcher_run_id_is_always_a_directory_name() {
        let vars = [("SLURM_JOB_ID", "77/../x y"), ("SLURM_STEP_ID", "0")];
        assert_eq!(launcher_run_id(env(&vars)).unwrap(), "slurm-77_.._x_y.0");
        let long = "9".repeat(300);
        let id = launcher_run_id(env(&[("PMI_KVSNAME", &long)])).unwrap();
        assert_eq!(id.len(), 128);
        assert!(id.starts_with("pmi-999"), "{id}");
        let other = launcher_run_id(env(&[("PMI_KVSNAME", &format!("{long}8"))])).unwrap();
        assert_ne!(id, other, "two long ids stay apart");
    }

    #[test]
    fn an_indexed_job_needs_the_size_flag() {
        let vars = [("JOB_COMPLETION_INDEX", "2")];
        let e = detect(given(None, None), &vars).unwrap_err();
        assert!(e.to_string().contains("--world-size"), "{e}");
        let flags = given(None, Some(5));
        let r = detect(flags, &vars).unwrap().unwrap();
        assert_eq!((r.rank, r.world_size), (2, 5));
    }

    #[test]
    fn flags_win_and_are_checked() {
        let vars = [("OMPI_COMM_WORLD_RANK", "3"), ("OMPI_COMM_WORLD_SIZE", "4")];
        let flags = given(Some(1), Some(2));
        let r = detect(flags, &vars).unwrap().unwrap();
        assert_eq!((r.rank, r.world_size, r.source.as_str()), (1, 2, "--rank"));
        for (rank, world) in [(Some(2), Some(2)), (Some(0), Some(0)), (Some(0), None)] {
            let flags = given(rank, world);
            assert_eq!(
                detect(flags, &[]).unwrap_err().kind,
                kvtrace_io::error::ErrorKind::Usage
            );
        }
        let lonely = given(None, Some(3));
        assert!(detect(lonely, &[]).is_err());
    }

    #[test]
    fn a_process_on_its_own_has_no_rank() {
        assert_eq!(detect(given(None, None), &[]).unwrap(), None);
        let one = given(None, Some(1));
        assert_eq!(detect(one, &[]).unwrap(), None);
    }

    #[test]
    fn a_bad_variable_is_named() {
        let e = detect(given(None, None), &[("SLURM_PROCID", "x")]).unwrap_err();
        assert!(e.to_string().contains("SLURM_PROCID"), "{e}");
    }

    #[test]
    fn seeds_and_directories_differ_per_rank() {
        let r = Rank {
            rank: 7,
            world_size: 8,
            source: "--rank".into(),
        };
        assert_eq!(r.seed(42), 49);
        assert_eq!(r.dir_name(), "rank-00007");
        assert_eq!(
            launcher_run_id(env(&[("SLURM_JOB_ID", "9"), ("SLURM_STEP_ID", "0")])),
            Some("slurm-9.0".into())
        );
    }
}
