//! The grid arithmetic of a prefetch, as LMCache 0.5.6's prefetch controller and policy do it
//! (`storage_controllers/prefetch_controller.py`, `prefetch_policy.py`,
//! `bitmap_ops/fold.py`): a request is a grid of one row per key group and one column per
//! chunk; *fold* turns the per-row presence into the model-wide hit length (every row must
//! serve the prefix under its own attention rule), *unfold* into the cells each row needs.

/// A row-major grid of cells.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Grid {
    cols: usize,
    cells: Vec<bool>,
}

impl Grid {
    pub fn new(rows: usize, cols: usize) -> Grid {
        Grid {
            cols,
            cells: vec![false; rows * cols],
        }
    }

    pub fn rows(&self) -> usize {
        self.cells.len().checked_div(self.cols).unwrap_or(0)
    }

    pub fn cols(&self) -> usize {
        self.cols
    }

    pub fn get(&self, row: usize, col: usize) -> bool {
        col < self.cols && self.cells[row * self.cols + col]
    }

    pub fn set(&mut self, row: usize, col: usize, v: bool) {
        if col < self.cols {
            self.cells[row * self.cols + col] = v;
        }
    }

    pub fn count(&self) -> usize {
        self.cells.iter().filter(|&&c| c).count()
    }

    /// Cell-wise `self && other`.
    pub fn and(&self, other: &Grid) -> Grid {
        self.zip(other, |a, b| a && b)
    }

    /// Cell-wise `self && !other`.
    pub fn minus(&self, other: &Grid) -> Grid {
        self.zip(other, |a, b| a && !b)
    }

    pub fn or(&self, other: &Grid) -> Grid {
        self.zip(other, |a, b| a || b)
    }

    fn zip(&self, other: &Grid, f: impl Fn(bool, bool) -> bool) -> Grid {
        Grid {
            cols: self.cols,
            cells: self
                .cells
                .iter()
                .zip(&other.cells)
                .map(|(&a, &b)| f(a, b))
                .collect(),
        }
    }

    /// The set cells, row-major (LMCache's gather order).
    pub fn cells(&self) -> impl Iterator<Item = (usize, usize)> + '_ {
        self.cells
            .iter()
            .enumerate()
            .filter(|(_, &c)| c)
            .map(|(i, _)| (i / self.cols, i % self.cols))
    }

    /// Columns set in every row (a `full` fetch can use a column only whole).
    pub fn whole_columns(&self) -> Grid {
        let mut out = Grid::new(self.rows(), self.cols);
        for col in 0..self.cols {
            if (0..self.rows()).all(|row| self.get(row, col)) {
                for row in 0..self.rows() {
                    out.set(row, col, true);
                }
            }
        }
        out
    }
}

/// Whether a row with sliding window `window` (chunks; `<= 0` is full attention) can serve a
/// prefix of `len` chunks: it needs the last `min(window, len)` of them (all, for full
/// attention).
fn servable(grid: &Grid, row: usize, window: i64, len: usize) -> bool {
    let lo = if window <= 0 {
        0
    } else {
        len.saturating_sub(window as usize)
    };
    (lo..len).all(|col| grid.get(row, col))
}

/// Fold and unfold: the model-wide hit length (the longest prefix every row can serve) and
/// the cells each row needs for it.
pub fn fold_unfold(found: &Grid, windows: &[i64]) -> (usize, Grid) {
    let rows = found.rows();
    let window = |row: usize| windows.get(row).copied().unwrap_or(-1);
    let hit = (1..=found.cols())
        .rev()
        .find(|&len| (0..rows).all(|row| servable(found, row, window(row), len)))
        .unwrap_or(0);
    let mut retain = Grid::new(rows, found.cols());
    for row in 0..rows {
        let w = window(row);
        let lo = if w <= 0 {
            0
        } else {
            hit.saturating_sub(w as usize)
        };
        for col in lo..hit {
            retain.set(row, col, true);
        }
    }
    (hit, retain)
}

/// The cells a prefetch keeps: the unfolded hit prefix (`prefix`) or every whole column
/// found (`full`, which no sliding-window row may join).
pub fn needed(found: &Grid, windows: &[i64], prefix_only: bool) -> Grid {
    if prefix_only {
        fold_unfold(found, windows).1.and(found)
    } else if windows.iter().any(|&w| w > 0) {
        Grid::new(found.rows(), found.cols())
    } else {
        found.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grid(rows: &[&str]) -> Grid {
        let cols = rows[0].len();
        let mut g = Grid::new(rows.len(), cols);
        for (r, s) in rows.iter().enumerate() {
            for (c, ch) in s.chars().enumerate() {
                g.set(r, c, ch == '1');
            }
        }
        g
    }

    #[test]
    fn full_attention_rows_hit_their_common_leading_prefix() {
        let (hit, retain) = fold_unfold(&grid(&["11101", "11011"]), &[-1, -1]);
        assert_eq!(hit, 2);
        assert_eq!(retain, grid(&["11000", "11000"]));
    }

    #[test]
    fn a_sliding_window_row_needs_only_the_last_chunks_of_the_prefix() {
        // Row 1 has a window of 2: for a prefix of 4 it needs chunks 2 and 3 only.
        let (hit, retain) = fold_unfold(&grid(&["11110", "00110"]), &[-1, 2]);
        assert_eq!(hit, 4);
        assert_eq!(retain, grid(&["11110", "00110"]));
    }

    #[test]
    fn no_leading_chunk_means_no_hit() {
        assert_eq!(fold_unfold(&grid(&["01111"]), &[-1]).0, 0);
    }

    #[test]
    fn a_full_fetch_keeps_every_found_cell_unless_a_row_has_a_window() {
        let found = grid(&["10110"]);
        assert_eq!(needed(&found, &[-1], false), found);
        assert_eq!(needed(&found, &[-1], true), grid(&["10000"]));
        assert_eq!(needed(&found, &[3], false).count(), 0);
    }
}
