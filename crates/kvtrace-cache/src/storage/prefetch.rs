//! The grid arithmetic of a prefetch, as LMCache 0.5.6's prefetch controller and policy do it
//! (`storage_controllers/prefetch_controller.py`, `prefetch_policy.py`,
//! `bitmap_ops/fold.py`): a request is a grid of one row per key group and one column per
//! chunk; *fold* turns the per-row presence into the model-wide hit length (every row must
//! serve the prefix under its own attention rule), *unfold* into the cells each row needs.

use smallvec::SmallVec;

/// A row-major grid of cells, one bit each. A prefetch builds a dozen grids per call: the
/// bits of a prompt of up to 256 chunks (one row per key group) live inline, so a call
/// allocates none of them, and the cell-wise operations go a word at a time.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Grid {
    rows: usize,
    cols: usize,
    /// Bit `row * cols + col`; bits past the last cell are always clear.
    bits: SmallVec<[u64; 4]>,
}

impl Grid {
    pub fn new(rows: usize, cols: usize) -> Grid {
        let cells = rows * cols;
        Grid {
            rows: if cols == 0 { 0 } else { rows },
            cols,
            bits: smallvec::smallvec![0; cells.div_ceil(64)],
        }
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn cols(&self) -> usize {
        self.cols
    }

    pub fn get(&self, row: usize, col: usize) -> bool {
        if col >= self.cols {
            return false;
        }
        let i = row * self.cols + col;
        self.bits[i / 64] >> (i % 64) & 1 == 1
    }

    pub fn set(&mut self, row: usize, col: usize, v: bool) {
        if col < self.cols {
            let i = row * self.cols + col;
            let bit = 1u64 << (i % 64);
            if v {
                self.bits[i / 64] |= bit;
            } else {
                self.bits[i / 64] &= !bit;
            }
        }
    }

    pub fn count(&self) -> usize {
        self.bits.iter().map(|w| w.count_ones() as usize).sum()
    }

    /// Cell-wise `self && other`.
    pub fn and(&self, other: &Grid) -> Grid {
        self.zip(other, |a, b| a & b)
    }

    /// Cell-wise `self && !other`.
    pub fn minus(&self, other: &Grid) -> Grid {
        self.zip(other, |a, b| a & !b)
    }

    pub fn or(&self, other: &Grid) -> Grid {
        self.zip(other, |a, b| a | b)
    }

    /// Word-wise `f` over grids of one shape (`f` keeps clear bits clear where both are).
    fn zip(&self, other: &Grid, f: impl Fn(u64, u64) -> u64) -> Grid {
        Grid {
            rows: self.rows,
            cols: self.cols,
            bits: self
                .bits
                .iter()
                .zip(&other.bits)
                .map(|(&a, &b)| f(a, b))
                .collect(),
        }
    }

    /// The set cells, row-major (LMCache's gather order).
    pub fn cells(&self) -> impl Iterator<Item = (usize, usize)> + '_ {
        let cols = self.cols;
        self.bits.iter().enumerate().flat_map(move |(w, &word)| {
            let mut rest = word;
            std::iter::from_fn(move || {
                if rest == 0 {
                    return None;
                }
                let i = w * 64 + rest.trailing_zeros() as usize;
                rest &= rest - 1;
                Some((i / cols, i % cols))
            })
        })
    }

    /// How many cells of `row` are set before its first clear one.
    fn leading_set(&self, row: usize) -> usize {
        (0..self.cols)
            .position(|col| !self.get(row, col))
            .unwrap_or(self.cols)
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
    // A full-attention row serves exactly the prefixes within its leading set cells, so the
    // search starts at the shortest such run instead of at every column.
    let longest = (0..rows)
        .filter(|&row| window(row) <= 0)
        .map(|row| found.leading_set(row))
        .min()
        .unwrap_or(found.cols());
    let hit = (1..=longest)
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

    /// The fold as LMCache's `fold.py` states it, on plain cells: the longest prefix every
    /// row can serve, by trying every length from the longest down.
    fn reference_fold(cells: &[Vec<bool>], windows: &[i64]) -> usize {
        let cols = cells.first().map_or(0, Vec::len);
        (1..=cols)
            .rev()
            .find(|&len| {
                cells.iter().enumerate().all(|(row, c)| {
                    let w = windows.get(row).copied().unwrap_or(-1);
                    let lo = if w <= 0 {
                        0
                    } else {
                        len.saturating_sub(w as usize)
                    };
                    c[lo..len].iter().all(|&x| x)
                })
            })
            .unwrap_or(0)
    }

    #[test]
    fn bit_grids_agree_with_plain_cells_at_every_size() {
        // xorshift: a fixed sequence, so a failure reproduces.
        let mut state = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        for _ in 0..3000 {
            let rows = 1 + (next() % 3) as usize;
            // Across the inline words and past them: 1..=300 columns.
            let cols = 1 + (next() % 300) as usize;
            // Mostly leading runs, as caches hold prefixes, with holes.
            let cells: Vec<Vec<bool>> = (0..rows)
                .map(|_| {
                    let run = (next() % (cols as u64 + 1)) as usize;
                    (0..cols).map(|c| c < run || next() % 4 == 0).collect()
                })
                .collect();
            let windows: Vec<i64> = (0..rows)
                .map(|_| match next() % 3 {
                    0 => 1 + (next() % 8) as i64,
                    _ => -1,
                })
                .collect();
            let mut g = Grid::new(rows, cols);
            for (r, row) in cells.iter().enumerate() {
                for (c, &v) in row.iter().enumerate() {
                    g.set(r, c, v);
                }
            }
            let set = cells.iter().flatten().filter(|&&v| v).count();
            assert_eq!(g.count(), set);
            let listed: Vec<(usize, usize)> = g.cells().collect();
            let expected: Vec<(usize, usize)> = (0..rows)
                .flat_map(|r| (0..cols).map(move |c| (r, c)))
                .filter(|&(r, c)| cells[r][c])
                .collect();
            assert_eq!(listed, expected);
            let (hit, retain) = fold_unfold(&g, &windows);
            assert_eq!(
                hit,
                reference_fold(&cells, &windows),
                "{cells:?} {windows:?}"
            );
            for (r, &w) in windows.iter().enumerate() {
                let lo = if w <= 0 {
                    0
                } else {
                    hit.saturating_sub(w as usize)
                };
                for c in 0..cols {
                    assert_eq!(retain.get(r, c), (lo..hit).contains(&c));
                }
            }
            let (minus, or, and) = (g.minus(&retain), g.or(&retain), g.and(&retain));
            for (r, row) in cells.iter().enumerate() {
                for (c, &a) in row.iter().enumerate() {
                    let b = retain.get(r, c);
                    assert_eq!(minus.get(r, c), a && !b);
                    assert_eq!(or.get(r, c), a || b);
                    assert_eq!(and.get(r, c), a && b);
                }
            }
            // Clearing every cell leaves a grid equal to a new one.
            let mut cleared = g.clone();
            for (r, c) in g.cells() {
                cleared.set(r, c, false);
            }
            assert_eq!(cleared, Grid::new(rows, cols));
        }
    }

    #[test]
    fn a_full_fetch_keeps_every_found_cell_unless_a_row_has_a_window() {
        let found = grid(&["10110"]);
        assert_eq!(needed(&found, &[-1], false), found);
        assert_eq!(needed(&found, &[-1], true), grid(&["10000"]));
        assert_eq!(needed(&found, &[3], false).count(), 0);
    }
}
