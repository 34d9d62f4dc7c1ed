//! The two inner loops of a tile in explicit vector registers: scores of
//! one transposed key block, and the weighted sum of values. The compiler
//! kept the lane arrays of the portable form on the stack, one scalar FMA
//! at a time; these keep every partial sum in a register.
//!
//! Each lane is one element (a key's score, an output dimension) and runs
//! exactly the portable form's sequence of operations, so the bits are the
//! same whichever form runs.

use super::tile::BLOCK;
use super::{Isa, KvElem};

/// Scores of `N` queries against the 16 keys of one transposed block:
/// lane `j` accumulates `q[c·8+l]·k_j[c·8+l]` into partial sum `l` by FMA
/// for `c` in order, then `((l0+l4)+(l1+l5))+((l2+l6)+(l3+l7))`, then the
/// tail FMAs.
#[inline(always)]
pub(super) fn scores<const N: usize>(
    isa: Isa,
    qs: [&[f32]; N],
    block: &[f32],
    d: usize,
) -> [[f32; BLOCK]; N] {
    assert!(block.len() >= BLOCK * d && qs.iter().all(|q| q.len() >= d));
    match isa {
        #[cfg(all(
            target_arch = "x86_64",
            target_feature = "avx2",
            target_feature = "fma",
            target_feature = "f16c"
        ))]
        // SAFETY: AVX-512F is detected before `Isa::Avx512` is chosen; the
        // lengths are checked above.
        Isa::Avx512 => unsafe { x86::scores512(qs, block, d) },
        #[cfg(all(
            target_arch = "x86_64",
            target_feature = "avx2",
            target_feature = "fma",
            target_feature = "f16c"
        ))]
        // SAFETY: AVX2 and FMA at compile time; lengths checked above.
        Isa::Avx2 => unsafe { x86::scores256(qs, block, d) },
        _ => portable_scores(qs, block, d),
    }
}

/// `acc[b·d + e] += p[b·width + j] · v[j·d + e]` for `j` in `keys` in
/// order and `e` in `cols`, for `QB` rows: a product and then a sum (no
/// FMA); an f16 `v` widened to f32 first. (Columns are independent
/// elements: any split of `0..d` gives the same bits.)
#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub(super) fn weighted<const QB: usize, E: KvElem>(
    isa: Isa,
    p: &[f32],
    width: usize,
    values: &[E],
    d: usize,
    cols: std::ops::Range<usize>,
    keys: std::ops::Range<usize>,
    acc: &mut [f32],
) {
    if keys.is_empty() || cols.is_empty() {
        return;
    }
    assert!(cols.end <= d);
    assert!(p.len() >= (QB - 1) * width + keys.end && acc.len() >= QB * d);
    assert!(values.len() >= keys.end * d);
    let done = match isa {
        #[cfg(all(
            target_arch = "x86_64",
            target_feature = "avx2",
            target_feature = "fma",
            target_feature = "f16c"
        ))]
        // SAFETY: as in `scores`; every index is below the lengths checked.
        Isa::Avx512 => unsafe {
            x86::weighted512::<QB, E>(p, width, values, d, cols.clone(), keys.clone(), acc)
        },
        #[cfg(all(
            target_arch = "x86_64",
            target_feature = "avx2",
            target_feature = "fma",
            target_feature = "f16c"
        ))]
        // SAFETY: as above.
        Isa::Avx2 => unsafe {
            x86::weighted256::<QB, E>(p, width, values, d, cols.clone(), keys.clone(), acc)
        },
        _ => cols.start,
    };
    // The columns past the last whole vector (all of them, portably).
    for e in done..cols.end {
        for b in 0..QB {
            let mut a = acc[b * d + e];
            for j in keys.clone() {
                a += p[b * width + j] * values[j * d + e].widen();
            }
            acc[b * d + e] = a;
        }
    }
}

fn portable_scores<const N: usize>(qs: [&[f32]; N], block: &[f32], d: usize) -> [[f32; BLOCK]; N] {
    let chunks = d / 8;
    std::array::from_fn(|n| {
        let q = qs[n];
        std::array::from_fn(|j| {
            let mut l = [0f32; 8];
            for c in 0..chunks {
                for (i, l) in l.iter_mut().enumerate() {
                    let e = c * 8 + i;
                    *l = q[e].mul_add(block[e * BLOCK + j], *l);
                }
            }
            let mut s = ((l[0] + l[4]) + (l[1] + l[5])) + ((l[2] + l[6]) + (l[3] + l[7]));
            for e in chunks * 8..d {
                s = q[e].mul_add(block[e * BLOCK + j], s);
            }
            s
        })
    })
}

#[cfg(all(
    target_arch = "x86_64",
    target_feature = "avx2",
    target_feature = "fma",
    target_feature = "f16c"
))]
mod x86 {
    use super::{BLOCK, KvElem};
    use std::arch::x86_64::*;

    /// The 8 partial sums to one score per lane, in the documented tree.
    macro_rules! tree {
        ($a:expr, $add:ident) => {
            $add(
                $add($add($a[0], $a[4]), $add($a[1], $a[5])),
                $add($add($a[2], $a[6]), $add($a[3], $a[7])),
            )
        };
    }

    // `l` names both the partial sum and the key row it reads.
    #[allow(clippy::needless_range_loop)]
    #[inline]
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn scores512<const N: usize>(
        qs: [&[f32]; N],
        block: &[f32],
        d: usize,
    ) -> [[f32; BLOCK]; N] {
        let chunks = d / 8;
        let kp = block.as_ptr();
        let mut acc = [[_mm512_setzero_ps(); 8]; N];
        // SAFETY (whole function): the caller checked `block` holds
        // `BLOCK·d` values and every query `d`.
        unsafe {
            for c in 0..chunks {
                for l in 0..8 {
                    let e = c * 8 + l;
                    let k = _mm512_loadu_ps(kp.add(e * BLOCK));
                    for n in 0..N {
                        let q = _mm512_set1_ps(*qs[n].get_unchecked(e));
                        acc[n][l] = _mm512_fmadd_ps(q, k, acc[n][l]);
                    }
                }
            }
            let mut out = [[0f32; BLOCK]; N];
            for n in 0..N {
                let mut s = tree!(acc[n], _mm512_add_ps);
                for e in chunks * 8..d {
                    let q = _mm512_set1_ps(*qs[n].get_unchecked(e));
                    s = _mm512_fmadd_ps(q, _mm512_loadu_ps(kp.add(e * BLOCK)), s);
                }
                _mm512_storeu_ps(out[n].as_mut_ptr(), s);
            }
            out
        }
    }

    #[allow(clippy::needless_range_loop)]
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn scores256<const N: usize>(
        qs: [&[f32]; N],
        block: &[f32],
        d: usize,
    ) -> [[f32; BLOCK]; N] {
        let chunks = d / 8;
        let mut out = [[0f32; BLOCK]; N];
        // SAFETY: as in `scores512`; each half is 8 of the 16 lanes.
        unsafe {
            for half in [0, 8] {
                let kp = block.as_ptr().add(half);
                let mut acc = [[_mm256_setzero_ps(); 8]; N];
                for c in 0..chunks {
                    for l in 0..8 {
                        let e = c * 8 + l;
                        let k = _mm256_loadu_ps(kp.add(e * BLOCK));
                        for n in 0..N {
                            let q = _mm256_set1_ps(*qs[n].get_unchecked(e));
                            acc[n][l] = _mm256_fmadd_ps(q, k, acc[n][l]);
                        }
                    }
                }
                for n in 0..N {
                    let mut s = tree!(acc[n], _mm256_add_ps);
                    for e in chunks * 8..d {
                        let q = _mm256_set1_ps(*qs[n].get_unchecked(e));
                        s = _mm256_fmadd_ps(q, _mm256_loadu_ps(kp.add(e * BLOCK)), s);
                    }
                    _mm256_storeu_ps(out[n].as_mut_ptr().add(half), s);
                }
            }
        }
        out
    }

    /// Keys ahead whose value line a weighted sum asks memory for (the
    /// split plan's passes stride 128 of every 256 bytes of a value row,
    /// which the hardware prefetcher follows poorly at 4K keys).
    const VALUES_AHEAD: usize = 32;

    /// Whole groups of 16 dimensions of `cols` from its start; returns
    /// where they stopped.
    #[inline]
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    pub(super) unsafe fn weighted512<const QB: usize, E: KvElem>(
        p: &[f32],
        width: usize,
        values: &[E],
        d: usize,
        cols: std::ops::Range<usize>,
        keys: std::ops::Range<usize>,
        acc: &mut [f32],
    ) -> usize {
        let whole = cols.start + cols.len() / 16 * 16;
        let (pp, vp, ap) = (p.as_ptr(), values.as_ptr(), acc.as_mut_ptr());
        // SAFETY: the caller checked every length these indices reach.
        unsafe {
            for e0 in (cols.start..whole).step_by(16) {
                let mut a: [__m512; QB] =
                    std::array::from_fn(|b| _mm512_loadu_ps(ap.add(b * d + e0)));
                let end = keys.end;
                for j in keys.clone() {
                    if j + VALUES_AHEAD < end {
                        _mm_prefetch::<_MM_HINT_T0>(vp.add((j + VALUES_AHEAD) * d + e0).cast());
                    }
                    let v = load16!(E, vp.add(j * d + e0));
                    for (b, a) in a.iter_mut().enumerate() {
                        let pj = _mm512_set1_ps(*pp.add(b * width + j));
                        *a = _mm512_add_ps(*a, _mm512_mul_ps(pj, v));
                    }
                }
                for (b, a) in a.iter().enumerate() {
                    _mm512_storeu_ps(ap.add(b * d + e0), *a);
                }
            }
        }
        whole
    }

    /// Whole groups of 8 dimensions of `cols` from its start; returns
    /// where they stopped.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn weighted256<const QB: usize, E: KvElem>(
        p: &[f32],
        width: usize,
        values: &[E],
        d: usize,
        cols: std::ops::Range<usize>,
        keys: std::ops::Range<usize>,
        acc: &mut [f32],
    ) -> usize {
        let whole = cols.start + cols.len() / 8 * 8;
        let (pp, vp, ap) = (p.as_ptr(), values.as_ptr(), acc.as_mut_ptr());
        // SAFETY: the caller checked every length these indices reach.
        unsafe {
            for e0 in (cols.start..whole).step_by(8) {
                let mut a: [__m256; QB] =
                    std::array::from_fn(|b| _mm256_loadu_ps(ap.add(b * d + e0)));
                for j in keys.clone() {
                    let v = load8!(E, vp.add(j * d + e0));
                    for (b, a) in a.iter_mut().enumerate() {
                        let pj = _mm256_set1_ps(*pp.add(b * width + j));
                        *a = _mm256_add_ps(*a, _mm256_mul_ps(pj, v));
                    }
                }
                for (b, a) in a.iter().enumerate() {
                    _mm256_storeu_ps(ap.add(b * d + e0), *a);
                }
            }
        }
        whole
    }
}
