//! A replay sweep spread over ranks (`mpirun`, `srun`): rank `r` of `n` replays the points
//! `r`, `r + n`, `r + 2n`, … and writes them as a [`Slice`]; [`merge`] puts the slices of one
//! run back together into the sweep one process would have run, point for point, for every
//! format to write. The points need nothing from each other, so ranks never meet.
//!
//! What a merged sweep leaves out: the one-pass LRU curve and the model curves, which a single
//! process draws over all points; a merged sweep says so in `lru_curve_note`.
//!
//! A slice is untrusted input to `aggregate`: each is checked for its format, and together
//! they must be one run (the same trace, world size and point count) in which every point
//! appears exactly once.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};
use serde_json::Value as Json;

use super::replay::{Figures, ReplayPoint, ReplaySweep};
use super::Point;
use crate::error::{Error, Result};
use kvtrace_report::{JsonStyle, Report, Table};

/// The `format` of a slice file.
pub const SLICE_FORMAT: &str = "kvtrace-sweep-slice";
/// The slice layout this build writes and reads.
pub const SLICE_VERSION: u32 = 1;

/// The indices of the points rank `rank` of `world_size` replays, of `total`.
pub fn points_of(rank: u32, world_size: u32, total: usize) -> Vec<usize> {
    (rank as usize..total)
        .step_by(world_size.max(1) as usize)
        .collect()
}

/// One rank's share of a sweep: its points, each with its index in the whole sweep.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Slice {
    pub format: String,
    pub version: u32,
    pub trace: String,
    pub rank: u32,
    pub world_size: u32,
    /// Points in the whole sweep, every rank's together.
    pub points_total: u64,
    /// The rank stopped at a signal: its slice holds only the points that finished.
    pub interrupted: bool,
    pub points: Vec<SlicePoint>,
}

/// A point of a slice.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SlicePoint {
    pub index: u64,
    pub name: String,
    pub settings: Vec<(String, String)>,
    pub summary: Json,
    pub figures: Figures,
    pub replay_s: f64,
}

impl Slice {
    /// The slice of rank `rank` of `world_size`: `sweep` holds its points, which are the
    /// whole sweep's `indices`.
    pub fn of(
        sweep: &ReplaySweep,
        indices: &[usize],
        rank: u32,
        world_size: u32,
        points_total: usize,
    ) -> Slice {
        Slice {
            format: SLICE_FORMAT.into(),
            version: SLICE_VERSION,
            trace: sweep.trace.clone(),
            rank,
            world_size,
            points_total: points_total as u64,
            interrupted: crate::interrupt::requested().is_some(),
            points: sweep
                .points
                .iter()
                .zip(indices)
                .map(|(p, &index)| SlicePoint {
                    index: index as u64,
                    name: p.point.name.clone(),
                    settings: p.point.settings.clone(),
                    summary: p.summary.clone(),
                    figures: p.figures.clone(),
                    replay_s: p.replay_s,
                })
                .collect(),
        }
    }

    /// Whether a JSON document is a slice (by its `format`), before it is read as one.
    pub fn is_slice(doc: &Json) -> bool {
        doc.get("format").and_then(Json::as_str) == Some(SLICE_FORMAT)
    }

    /// A slice from its JSON document, read from `file`.
    pub fn read(doc: Json, file: &str) -> Result<Slice> {
        let slice: Slice = serde_json::from_value(doc)
            .map_err(|e| Error::bad_input(format!("{file}: not a sweep slice: {e}")))?;
        if slice.version != SLICE_VERSION {
            return Err(Error::bad_input(format!(
                "{file}: version {}: this build reads sweep slices of version {SLICE_VERSION}",
                slice.version
            )));
        }
        Ok(slice)
    }
}

/// Puts the slices of one run — `(file, slice)`, every rank's — back into one sweep, its
/// points in the order the whole sweep has them.
pub fn merge(slices: Vec<(String, Slice)>) -> Result<ReplaySweep> {
    let Some((first_file, first)) = slices.first() else {
        return Err(Error::usage("no sweep slices to merge"));
    };
    let first_file = first_file.clone();
    let (trace, world_size, total) = (first.trace.clone(), first.world_size, first.points_total);
    if world_size == 0 {
        return Err(Error::bad_input(format!("{first_file}: world_size 0")));
    }
    let ranks = slices.len();
    // Held by index as they come: nothing here is sized by a number a file claims.
    let mut placed: BTreeMap<u64, ReplayPoint> = BTreeMap::new();
    let mut seen_ranks: BTreeSet<u32> = BTreeSet::new();
    let mut interrupted = false;
    for (file, slice) in slices {
        let differs = |what: &str, this: String, first: String| {
            Error::bad_input(format!(
                "{file}: {what} {this}, but {first_file} has {first}: slices of different runs"
            ))
        };
        if slice.trace != trace {
            return Err(differs("trace", slice.trace, trace));
        }
        if slice.world_size != world_size {
            return Err(differs(
                "world_size",
                slice.world_size.to_string(),
                world_size.to_string(),
            ));
        }
        if slice.points_total != total {
            return Err(differs(
                "points_total",
                slice.points_total.to_string(),
                total.to_string(),
            ));
        }
        if slice.rank >= world_size {
            return Err(Error::bad_input(format!(
                "{file}: rank {} of a world of {world_size}",
                slice.rank
            )));
        }
        if !seen_ranks.insert(slice.rank) {
            return Err(Error::bad_input(format!(
                "{file}: rank {} appears twice",
                slice.rank
            )));
        }
        interrupted |= slice.interrupted;
        for (i, p) in slice.points.into_iter().enumerate() {
            let index = p.index;
            let at =
                |why: &str| Error::bad_input(format!("{file}: points[{i}].index {index}: {why}"));
            if index >= total {
                return Err(at(&format!("past the sweep's {total} points")));
            }
            if index % u64::from(world_size) != u64::from(slice.rank) {
                return Err(at(&format!(
                    "not a point of rank {} of {world_size}",
                    slice.rank
                )));
            }
            let std::collections::btree_map::Entry::Vacant(slot) = placed.entry(index) else {
                return Err(at("appears twice"));
            };
            slot.insert(ReplayPoint {
                point: Point {
                    name: p.name,
                    settings: p.settings,
                },
                summary: p.summary,
                figures: p.figures,
                replay_s: p.replay_s,
            });
        }
    }
    if ranks as u64 != u64::from(world_size) {
        let missing: Vec<String> = (0..world_size)
            .filter(|r| !seen_ranks.contains(r))
            .take(8)
            .map(|r| r.to_string())
            .collect();
        return Err(Error::usage(format!(
            "{ranks} slices of a run of {world_size} ranks: rank(s) {} missing",
            missing.join(", ")
        )));
    }
    let missing = total - placed.len() as u64;
    if missing > 0 && !interrupted {
        return Err(Error::bad_input(format!(
            "{missing} of the sweep's {total} points are in no slice"
        )));
    }
    Ok(ReplaySweep {
        trace,
        points: placed.into_values().collect(),
        curve: None,
        curve_note: Some(format!(
            "merged from {world_size} ranks: the curves are drawn by a sweep in one process"
        )),
        model_curves: Vec::new(),
        // Each rank said its own.
        warnings: Vec::new(),
    })
}

impl Report for Slice {
    fn document(&self) -> Result<Json> {
        serde_json::to_value(self)
            .map_err(|e| Error::usage(format!("cannot encode the slice: {e}")))
    }

    fn json_style(&self) -> JsonStyle {
        JsonStyle::Pretty
    }

    fn tables(&self) -> Vec<Table> {
        Vec::new()
    }

    fn terminal(&self) -> String {
        format!(
            "rank {} of {}: {} of the sweep's {} points; merge the ranks' slices with kvtrace aggregate\n",
            self.rank,
            self.world_size,
            self.points.len(),
            self.points_total
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_point_falls_to_exactly_one_rank() {
        for world in 1..6u32 {
            for total in 0..20usize {
                let mut all: Vec<usize> = (0..world)
                    .flat_map(|r| points_of(r, world, total))
                    .collect();
                all.sort_unstable();
                assert_eq!(
                    all,
                    (0..total).collect::<Vec<_>>(),
                    "{world} ranks, {total}"
                );
            }
        }
    }
}
