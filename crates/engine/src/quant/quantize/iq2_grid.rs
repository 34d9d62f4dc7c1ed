//! The IQ2_XXS search tables `iq2xs_init_impl(GGML_TYPE_IQ2_XXS)` builds:
//! the 256 grid points as levels `2l + 1` (`kgrid_q2xs`), the map from an
//! 8-value level pattern (2 bits each) to its grid index (`kmap_q2xs`), and
//! for every pattern off the grid the grid points at its two smallest
//! squared distances (`kneighbors_q2xs`).
//!
//! The grid is our dequantizer's `IQ2XXS_GRID` (its bytes 0x08, 0x19, 0x2b
//! are levels 0, 1, 2; ggml's `kgrid_2bit_256` lists the same points in the
//! same order as 2-bit fields). Built once, on first use (about 11 M small
//! integer operations).

use std::sync::OnceLock;

use crate::quant::dequant::iq2::IQ2XXS_GRID;

/// `kmap_size`: patterns are 8 fields of 2 bits whose values the search
/// keeps in 0..=2, so the largest is `0b10…10` = 43690.
const KMAP_SIZE: usize = 43692;

pub(super) struct Iq2Grid {
    /// `kgrid_q2xs`: point `k`'s eight levels `2l + 1` (1, 3 or 5).
    pub grid: [[i8; 8]; 256],
    /// `kmap_q2xs`: a pattern's grid index, or `-(offset + 1)` of its
    /// neighbour list in [`Self::neighbours`].
    pub map: Vec<i32>,
    /// `kneighbors_q2xs`: per off-grid pattern, a count then that many grid
    /// indices, nearest distance first, increasing index within a distance
    /// (the order of the C's `qsort` on `(distance, index)`).
    pub neighbours: Vec<u16>,
}

impl Iq2Grid {
    /// The neighbour list of an off-grid pattern whose map entry is `m < 0`.
    pub fn neighbours_of(&self, m: i32) -> &[u16] {
        let at = (-m - 1) as usize;
        let n = self.neighbours[at] as usize;
        &self.neighbours[at + 1..at + 1 + n]
    }
}

pub(super) fn tables() -> &'static Iq2Grid {
    static TABLES: OnceLock<Iq2Grid> = OnceLock::new();
    TABLES.get_or_init(build)
}

fn build() -> Iq2Grid {
    let grid: [[i8; 8]; 256] = std::array::from_fn(|k| {
        let bytes = IQ2XXS_GRID[k].to_le_bytes();
        std::array::from_fn(|i| match bytes[i] {
            0x08 => 1,
            0x19 => 3,
            _ => 5, // 0x2b
        })
    });
    let mut map = vec![-1i32; KMAP_SIZE];
    for (k, g) in grid.iter().enumerate() {
        let index: usize = g
            .iter()
            .enumerate()
            .map(|(i, &p)| (((p - 1) / 2) as usize) << (2 * i))
            .sum();
        map[index] = k as i32;
    }
    // `nwant = 2`: every grid point at the smallest distance, then every
    // one at the second smallest (the C sorts all 256 by (distance, index)
    // and stops at the third distinct distance; a scan gives the same list).
    let mut neighbours = Vec::new();
    let mut dist2 = [0i32; 256];
    for (i, entry) in map.iter_mut().enumerate() {
        if *entry >= 0 {
            continue;
        }
        let pos: [i32; 8] = std::array::from_fn(|k| 2 * ((i >> (2 * k)) & 3) as i32 + 1);
        for (d, g) in dist2.iter_mut().zip(&grid) {
            *d = g
                .iter()
                .zip(&pos)
                .map(|(&p, &q)| (p as i32 - q).pow(2))
                .sum();
        }
        let first = *dist2.iter().min().unwrap_or(&0);
        let second = dist2.iter().copied().filter(|&d| d > first).min();
        *entry = -(neighbours.len() as i32 + 1);
        let count_at = neighbours.len();
        neighbours.push(0);
        for level in std::iter::once(first).chain(second) {
            neighbours.extend((0..256u16).filter(|&j| dist2[j as usize] == level));
        }
        neighbours[count_at] = (neighbours.len() - count_at - 1) as u16;
    }
    Iq2Grid {
        grid,
        map,
        neighbours,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Spot checks against ggml's `kgrid_2bit_256` (first and last
    /// entries: 0, 2, 5, 8 … 43088, 43268) and the map's consistency.
    #[test]
    fn grid_is_ggmls() {
        let t = tables();
        let packed = |k: usize| -> u32 {
            t.grid[k]
                .iter()
                .enumerate()
                .map(|(i, &p)| (((p - 1) / 2) as u32) << (2 * i))
                .sum()
        };
        assert_eq!([packed(0), packed(1), packed(2), packed(3)], [0, 2, 5, 8]);
        assert_eq!([packed(254), packed(255)], [43088, 43268]);
        for k in 0..256 {
            assert_eq!(t.map[packed(k) as usize], k as i32);
        }
        let off_grid = t.map.iter().filter(|&&m| m < 0).count();
        assert_eq!(off_grid, KMAP_SIZE - 256);
        assert!(
            t.map
                .iter()
                .filter(|&&m| m < 0)
                .all(|&m| !t.neighbours_of(m).is_empty())
        );
    }
}
