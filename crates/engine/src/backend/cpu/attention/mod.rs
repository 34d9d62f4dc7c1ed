//! Causal attention whose result for a query does not depend on how the
//! sequence was split into forwards.
//!
//! A warm turn (earlier tokens from the cache, the rest prefilled) must give
//! bit-identical logits to a cold turn that prefills everything at once.
//! Batched matmuls cannot promise that: the reduction order of a GEMM
//! depends on the matrix shapes, so the same query row summed inside a
//! 40-row chunk and as a single decode row can differ in the last bit, and
//! a greedy near tie then flips. Here every query row is computed in one
//! fixed order whatever the chunk:
//!
//! 1. scores `s_j = q·k_j` for the visible keys, each the fixed-order dot
//!    below (8 FMA lanes over `⌊d/8⌋` blocks, `((l0+l4)+(l1+l5))+((l2+l6)+
//!    (l3+l7))`, then the tail FMAs);
//! 2. `m = max s_j`; `p_j = exp(s_j − m)` (glibc's `expf`, see [`exp`]);
//!    `Σ p_j` summed in key order from `+0`;
//! 3. `acc_e = Σ p_j·v_je` in key order from `+0` (a product, then a sum:
//!    no FMA), and the output `acc_e · (1/Σ)`.
//!
//! The linear layers around it use [`super::block_matmul`], which is
//! row-independent in the same way.
//!
//! Speed comes from computing many queries at once without touching that
//! order ([`tile`]): the queries of a *tile* (a few consecutive positions of
//! every query head that shares a kv head) read each key and value once,
//! the scores of 16 keys are 16 lanes (keys transposed in blocks of 16, so
//! lane `j` runs key `j`'s own 8 partial sums), `exp` runs 8 or 16 lanes,
//! the tile's row sums are interleaved, and the weighted sums keep 16 (or 8)
//! dimensions of several rows in registers while the keys go by in order.
//! Only which element is computed when changes; every element's own
//! sequence of operations is the one above, so the AVX-512 and AVX2 kernel
//! sets and the portable code give the same bits, and so does any tiling.
//!
//! Inputs (strided [`View`]s): per kv head `h`, query rows `r = g·t + i`
//! (f32; group member `g` at window position `i`, already scaled by
//! `1/√d`) and keys/values `0 .. offset + t` (the cache, token-major in
//! `CpuOps`), f32 or f16 ([`KvElem`]). Query `i` sees keys `0 ..= offset +
//! i`.
//!
//! An f16 cache is read by widening each key and value element to f32 as
//! it is loaded (F16C `vcvtph2ps` in the AVX2 and AVX-512 sets, `half`'s
//! exact conversion portably) and then running the f32 sequence above
//! unchanged. Widening is exact, so the result over f16 rows equals, bit
//! for bit, the f32 kernel over the widened rows, whatever the kernel set,
//! tiling or chunking.

/// Eight key/value elements at `$p` (a `*const $E`) as f32 lanes: a load,
/// or for f16 a 128-bit load widened by `vcvtph2ps`. (Macros rather than
/// trait methods: they expand inside each caller's `target_feature`
/// function, so the intrinsics inline.)
#[cfg(all(
    target_arch = "x86_64",
    target_feature = "avx2",
    target_feature = "fma",
    target_feature = "f16c"
))]
macro_rules! load8 {
    ($E:ty, $p:expr) => {
        if <$E as $crate::backend::cpu::attention::KvElem>::HALF {
            _mm256_cvtph_ps(_mm_loadu_si128($p as *const __m128i))
        } else {
            _mm256_loadu_ps($p as *const f32)
        }
    };
}

/// Sixteen elements at `$p` as f32 lanes (AVX-512F; f16 widened from a
/// 256-bit load).
#[cfg(all(
    target_arch = "x86_64",
    target_feature = "avx2",
    target_feature = "fma",
    target_feature = "f16c"
))]
macro_rules! load16 {
    ($E:ty, $p:expr) => {
        if <$E as $crate::backend::cpu::attention::KvElem>::HALF {
            _mm512_cvtph_ps(_mm256_loadu_si256($p as *const __m256i))
        } else {
            _mm512_loadu_ps($p as *const f32)
        }
    };
}

mod batch;
mod exp;
mod lanes;
#[cfg(all(
    target_arch = "x86_64",
    target_feature = "avx2",
    target_feature = "fma",
    target_feature = "f16c"
))]
mod pairs;
mod split;
mod tile;

use super::SendPtr;
use super::block_matmul::Isa;
use tile::{Keys, Tile, TileRow};

pub(crate) use batch::{Session, causal_attention_batch};

/// An element of a key/value cache the kernels read: `f32`, or `f16`
/// (IEEE binary16, widened to f32 exactly as it is loaded).
pub trait KvElem: Copy + Send + Sync + 'static {
    /// Whether the element is an f16 (the vector loads convert with F16C).
    const HALF: bool;
    /// The element as f32 (exact for both types).
    fn widen(self) -> f32;
}

impl KvElem for f32 {
    const HALF: bool = false;
    #[inline(always)]
    fn widen(self) -> f32 {
        self
    }
}

impl KvElem for half::f16 {
    const HALF: bool = true;
    #[inline(always)]
    fn widen(self) -> f32 {
        self.to_f32()
    }
}

/// Rows of `d` values per head: row `b` of head `a` starts at
/// `heads[a][b·stride]` (each head's rows contiguous in its own buffer).
pub struct View<'a, E = f32> {
    pub heads: Vec<&'a [E]>,
    pub stride: usize,
}

impl<E> View<'_, E> {
    #[inline]
    fn row(&self, a: usize, b: usize, d: usize) -> &[E] {
        &self.heads[a][b * self.stride..][..d]
    }
}

/// Keys per transposed block (the score lanes of one pass).
const BLOCK: usize = tile::BLOCK;
/// Query rows a tile aims for: enough to reuse each key block from L1
/// many times, few enough that the tile's score rows stay in L2 at 8K keys.
const TILE_ROWS: usize = 16;
/// Below this many query rows per kv head (decode steps, short verify
/// windows) keys are read in place rather than transposed first: the
/// transposition would cost as much as the attention.
const TRANSPOSE_FROM_ROWS: usize = 8;

/// Causal attention of `rows = group·t` query rows per kv head.
///
/// `q[h, r]` is the query of group member `r / t` at window position
/// `r % t` for kv head `h`; `k[h, j]`, `v[h, j]` for `j < offset + t`. The
/// output row `(h, r)` is written at `y[out_row(h, r) ..]` (the caller
/// chooses the layout).
#[allow(clippy::too_many_arguments)]
pub fn causal_attention<E: KvElem>(
    q: &View<'_>,
    k: &View<'_, E>,
    v: &View<'_, E>,
    kvh: usize,
    rows: usize,
    t: usize,
    offset: usize,
    d: usize,
    y: &mut [f32],
    out_row: &(dyn Fn(usize, usize) -> usize + Sync),
) {
    causal_attention_planned(
        super::block_matmul::isa(),
        plan(),
        q,
        k,
        v,
        kvh,
        rows,
        t,
        offset,
        d,
        y,
        out_row,
    )
}

/// From this many keys, few query rows are computed by [`split`] (keys
/// and dimensions across threads) rather than by tiles: below it a step's
/// cache is small enough that the extra passes cost more than they save.
const SPLIT_FROM_KEYS: usize = 512;

/// The plan [`causal_attention`] runs: [`Plan::Auto`], or the one the
/// environment variable `DS4_CPU_ATTENTION=tiles|split` names (benchmarks
/// compare the two side by side; the bits are the same either way).
fn plan() -> Plan {
    static PLAN: std::sync::OnceLock<Plan> = std::sync::OnceLock::new();
    *PLAN.get_or_init(|| match std::env::var("DS4_CPU_ATTENTION").as_deref() {
        Ok("tiles") => Plan::Tiles,
        Ok("split") => Plan::Split,
        _ => Plan::Auto,
    })
}

/// How the rows are spread over threads; every plan gives the same bits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Plan {
    /// Tiles, or [`split`] for few rows over many keys.
    Auto,
    /// Tiles of query rows ([`tile`]).
    Tiles,
    /// Three passes split by keys and dimensions ([`split`]).
    Split,
}

/// [`causal_attention`] with the kernel set and the plan named (tests run
/// every set and compare the plans).
#[allow(clippy::too_many_arguments)]
pub(crate) fn causal_attention_planned<E: KvElem>(
    isa: Isa,
    plan: Plan,
    q: &View<'_>,
    k: &View<'_, E>,
    v: &View<'_, E>,
    kvh: usize,
    rows: usize,
    t: usize,
    offset: usize,
    d: usize,
    y: &mut [f32],
    out_row: &(dyn Fn(usize, usize) -> usize + Sync),
) {
    if t == 0 || rows == 0 || kvh == 0 {
        return;
    }
    // This head's visible keys and values are contiguous rows of `d` (a
    // stride of `d` is what every caller passes).
    assert!(
        k.stride == d && v.stride == d,
        "attention: rows must be packed"
    );
    let total = offset + t;
    let group = rows / t;
    let pool = candle_core::utils::barrier_pool();
    let threads = pool_threads();

    // Few tiles (decode steps, verify windows) over a long cache: split by
    // keys and dimensions instead, so each kv head's cache is read once.
    let few_tiles = kvh * t.div_ceil((TILE_ROWS / group).clamp(1, t)) < 4 * threads;
    let split = match plan {
        Plan::Auto => few_tiles && threads > 1 && total >= SPLIT_FROM_KEYS,
        Plan::Tiles => false,
        Plan::Split => true,
    };
    if split {
        split::run(isa, q, k, v, kvh, rows, t, offset, d, y, out_row);
        return;
    }

    let transposed = rows >= TRANSPOSE_FROM_ROWS;
    let blocks = total.div_ceil(BLOCK);
    let mut kt = Vec::new();
    if transposed {
        kt = vec![0f32; kvh * blocks * BLOCK * d];
        let kt_ptr = SendPtr(kt.as_mut_ptr());
        pool.execute_chunked(kvh * blocks, |range| {
            let kt_ptr = &kt_ptr;
            for item in range {
                let (h, b) = (item / blocks, item % blocks);
                let at = (h * blocks + b) * BLOCK * d;
                // SAFETY: each (head, block) owns its `BLOCK·d` values.
                let out = unsafe { std::slice::from_raw_parts_mut(kt_ptr.0.add(at), BLOCK * d) };
                tile::transpose_block(&k.heads[h][..total * d], b, d, out);
            }
        });
    }

    // Tiles: `span` consecutive positions of `members` group members of one
    // kv head. Few tiles (decode steps) split the group so both threads
    // work; otherwise a tile takes the whole group, which shares its keys.
    let grid = Grid::new(group, t, offset, few_tiles);
    let y_ptr = SendPtr(y.as_mut_ptr());
    let y_len = y.len();
    let keys = KvHeads {
        k,
        v,
        transposed: transposed.then_some((kt.as_slice(), blocks)),
    };
    pool.execute_chunked(kvh * grid.per_head(), |range| {
        let mut scratch = tile::Scratch::default();
        for item in range {
            // SAFETY: `y` outlives the pool's join; every item owns its rows.
            unsafe {
                grid.run_item(
                    isa,
                    item,
                    q,
                    &keys,
                    d,
                    (&y_ptr, y_len),
                    out_row,
                    &mut scratch,
                )
            };
        }
    });
}

/// One kv head's keys and values as the tiles read them: the rows in
/// place, or (`transposed`) blocks of keys transposed first, `blocks` per
/// head.
struct KvHeads<'a, 'b, E> {
    k: &'b View<'a, E>,
    v: &'b View<'a, E>,
    transposed: Option<(&'b [f32], usize)>,
}

/// How one window's query rows are cut into tiles: `span` consecutive
/// positions of `members` group members of one kv head. Which rows share a
/// tile decides only which elements are computed together, never a bit.
#[derive(Clone, Copy, Debug)]
struct Grid {
    group: usize,
    t: usize,
    offset: usize,
    members: usize,
    span: usize,
    member_blocks: usize,
    position_blocks: usize,
}

impl Grid {
    /// `split_group`: one group member a tile (few tiles: both threads
    /// work); otherwise a tile takes the whole group, which shares its keys.
    fn new(group: usize, t: usize, offset: usize, split_group: bool) -> Self {
        let (members, span) = if split_group {
            (1, TILE_ROWS.min(t))
        } else {
            (group, (TILE_ROWS / group).clamp(1, t))
        };
        Self {
            group,
            t,
            offset,
            members,
            span,
            member_blocks: group.div_ceil(members),
            position_blocks: t.div_ceil(span),
        }
    }

    /// Tiles per kv head.
    fn per_head(&self) -> usize {
        self.member_blocks * self.position_blocks
    }

    /// Tile `item` (kv head `item / per_head`) into `y`'s rows.
    ///
    /// # Safety
    /// `y.0` points at `y.1` writable values that outlive the call, and no
    /// other caller writes this tile's rows meanwhile.
    #[allow(clippy::too_many_arguments)]
    unsafe fn run_item<E: KvElem>(
        &self,
        isa: Isa,
        item: usize,
        q: &View<'_>,
        keys: &KvHeads<'_, '_, E>,
        d: usize,
        (y_ptr, y_len): (&SendPtr, usize),
        out_row: &(dyn Fn(usize, usize) -> usize + Sync),
        scratch: &mut tile::Scratch,
    ) {
        let per_head = self.per_head();
        let h = item / per_head;
        let (mb, pb) = (
            (item % per_head) / self.position_blocks,
            item % self.position_blocks,
        );
        let positions = pb * self.span..((pb + 1) * self.span).min(self.t);
        let total = self.offset + self.t;
        let mut tile_rows = Vec::with_capacity(self.members * self.span);
        for g in mb * self.members..((mb + 1) * self.members).min(self.group) {
            for i in positions.clone() {
                let r = g * self.t + i;
                let at = out_row(h, r);
                assert!(at + d <= y_len, "attention output row out of bounds");
                tile_rows.push(TileRow {
                    q: q.row(h, r, d),
                    visible: self.offset + i + 1,
                    // SAFETY: in bounds (checked above); each (h, r) is in
                    // one tile and owns its row of y (the caller's promise).
                    out: unsafe { std::slice::from_raw_parts_mut(y_ptr.0.add(at), d) },
                });
            }
        }
        let k = match keys.transposed {
            Some((kt, blocks)) => {
                Keys::Transposed(&kt[h * blocks * BLOCK * d..][..blocks * BLOCK * d])
            }
            None => Keys::Rows(&keys.k.heads[h][..total * d]),
        };
        tile::run(
            isa,
            &mut Tile {
                rows: tile_rows,
                keys: k,
                values: &keys.v.heads[h][..total * d],
                d,
            },
            scratch,
        );
    }
}

#[inline]
fn dot4<E: KvElem>(a: &[f32], b: [&[E]; 4]) -> [f32; 4] {
    #[cfg(all(
        target_arch = "x86_64",
        target_feature = "avx2",
        target_feature = "fma",
        target_feature = "f16c"
    ))]
    {
        // SAFETY: the cfg guarantees AVX2 and FMA at compile time.
        unsafe { avx2::dots(a, b) }
    }
    #[cfg(not(all(
        target_arch = "x86_64",
        target_feature = "avx2",
        target_feature = "fma",
        target_feature = "f16c"
    )))]
    {
        b.map(|b| dot(a, b))
    }
}

/// [`dot4`] on `isa`: two keys to a register where AVX-512 runs (the same
/// bits, `pairs.rs`).
#[inline(always)]
fn dot4_on<E: KvElem>(isa: Isa, a: &[f32], b: [&[E]; 4]) -> [f32; 4] {
    #[cfg(all(
        target_arch = "x86_64",
        target_feature = "avx2",
        target_feature = "fma",
        target_feature = "f16c"
    ))]
    if isa == Isa::Avx512 {
        // SAFETY: `Isa::Avx512` is chosen only where the CPU has AVX-512F.
        return unsafe { pairs::dots4(a, b) };
    }
    let _ = isa;
    dot4(a, b)
}

/// A fixed-order dot product: 8 interleaved partial sums `l[i % 8]` (one
/// FMA each), added as `((l0+l4)+(l1+l5))+((l2+l6)+(l3+l7))`, then the
/// tail. The same for every call whatever the batch (and `b` widened to
/// f32 first when it is f16).
#[inline]
fn dot<E: KvElem>(a: &[f32], b: &[E]) -> f32 {
    #[cfg(all(
        target_arch = "x86_64",
        target_feature = "avx2",
        target_feature = "fma",
        target_feature = "f16c"
    ))]
    {
        // SAFETY: the cfg guarantees AVX2 and FMA at compile time.
        unsafe { avx2::dots(a, [b])[0] }
    }
    #[cfg(not(all(
        target_arch = "x86_64",
        target_feature = "avx2",
        target_feature = "fma",
        target_feature = "f16c"
    )))]
    {
        let mut lanes = [0f32; 8];
        let chunks = a.len() / 8;
        for c in 0..chunks {
            for l in 0..8 {
                lanes[l] = a[c * 8 + l].mul_add(b[c * 8 + l].widen(), lanes[l]);
            }
        }
        let mut s = ((lanes[0] + lanes[4]) + (lanes[1] + lanes[5]))
            + ((lanes[2] + lanes[6]) + (lanes[3] + lanes[7]));
        for i in chunks * 8..a.len() {
            s = a[i].mul_add(b[i].widen(), s);
        }
        s
    }
}

#[cfg(all(
    target_arch = "x86_64",
    target_feature = "avx2",
    target_feature = "fma",
    target_feature = "f16c"
))]
mod avx2 {
    use super::KvElem;
    use std::arch::x86_64::*;

    /// `dot` of `a` with each of `b` (all at least `a.len()` long).
    // Inlined into the per-query loop (a call per key costs ~4% of a
    // prefill).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) fn dots<const N: usize, E: KvElem>(a: &[f32], b: [&[E]; N]) -> [f32; N] {
        let n = a.len();
        assert!(b.iter().all(|b| b.len() >= n));
        let chunks = n / 8;
        let mut acc = [_mm256_setzero_ps(); N];
        for c in 0..chunks {
            // SAFETY: c * 8 + 8 <= n <= every length.
            unsafe {
                let av = _mm256_loadu_ps(a.as_ptr().add(c * 8));
                for (acc, b) in acc.iter_mut().zip(&b) {
                    let bv = load8!(E, b.as_ptr().add(c * 8));
                    *acc = _mm256_fmadd_ps(av, bv, *acc);
                }
            }
        }
        std::array::from_fn(|i| {
            let v = acc[i];
            // [l0+l4, l1+l5, l2+l6, l3+l7], then (s0+s1) + (s2+s3).
            let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
            let h = _mm_hadd_ps(s, s);
            let mut total = _mm_cvtss_f32(_mm_add_ss(h, _mm_movehdup_ps(h)));
            for e in chunks * 8..n {
                total = a[e].mul_add(b[i][e].widen(), total);
            }
            total
        })
    }
}

/// candle's thread count, read once: `get_num_threads` parses
/// `/proc/cpuinfo` on every call (`num_cpus::get_physical`), about 20 µs in
/// a VM, and this ran once per attention call (30 times a decode step of the
/// default model: 0.6 ms of a 7.5 ms step on the main thread, with the pool
/// waiting). `main` sets `RAYON_NUM_THREADS` before any forward, so the
/// first call already sees the value every later call saw.
fn pool_threads() -> usize {
    static THREADS: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *THREADS.get_or_init(|| candle_core::utils::get_num_threads().max(1))
}

#[cfg(test)]
mod tests;
