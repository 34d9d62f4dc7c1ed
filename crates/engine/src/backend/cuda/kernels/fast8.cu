// The fast kernel set's products for Q8_0 / Q4_1 weights (`cuda/fast8.rs`):
// activations rounded to int8 blocks of 32, weights read in their integer
// form, integer sums on `dp4a` (one activation row) or on the tensor cores
// (`mma.sync` m16n8k32 s8, tiles of rows). The arithmetic is the CPU fast
// set's (`cpu/q8_matmul/mod.rs`, its scalar kernel the definition):
//
// - a row's block b: `d = amax / 127`, `q = rint(x · (1 / d))` clamped to
//   ±127 (0 for a NaN), `s = d · Σ q`;
// - per output element, over the blocks in order from acc = 0:
//   `acc = fma(dw · d, (float)Σ w·q, acc)`, then for Q4_1
//   `acc = fma(mw, s, acc)`. Σ w·q is an exact integer, so any split of a
//   block's 32 products (dp4a lanes, a tensor-core tile) gives the same one,
//   and the float steps run one block after the other in every kernel.
//
// So an output's bits depend on its weight row and activation row alone:
// the same for every row count, kernel, tile and part of a launch.
//
// Q4_1's quants are stored as four words a block, element 8c + i in nibble
// i of word c (`weights.rs`, `q4_1_quarters`). Masking word c gives the
// bytes of elements 8c + {0, 2, 4, 6} (low nibbles) and 8c + {1, 3, 5, 7}
// (high nibbles), so the activations of a Q4_1 product are stored in that
// order (`F8_PERM`): byte 8c + 4h + j of a block holds element 8c + 2j + h.
// A block's integer sum does not depend on the order of its terms.

// Activation byte position of element e of a block: Q8_0 in order, Q4_1 in
// the nibble order above.
__device__ __forceinline__ u32 f8_pos(u32 e, int q4) {
    return q4 ? 8 * (e / 8) + 4 * (e % 2) + (e % 8) / 2 : e;
}

// Round `blocks` blocks of 32 values of x (contiguous rows) into q (bytes,
// in `f8_pos` order), d and s (one f32 each): a warp per block, lane l on
// value l.
extern "C" __global__ void f8_quantize(u8* q, float* d, float* s, const float* x, u64 blocks,
                                       int q4) {
    dep_entry();
    u32 lane = threadIdx.x & 31;
    u64 warp = ((u64)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    u64 warps = ((u64)gridDim.x * blockDim.x) >> 5;
    for (u64 b = warp; b < blocks; b += warps) {
        float v = x[b * 32 + lane];
        float t = fabsf(v);
        // amax with the CPU fold's NaN rule: any NaN makes it NaN.
        bool nan = __any_sync(FULL_MASK, t != t);
        float a = warp_max(t != t ? 0.0f : t);
        float amax = nan ? __int_as_float(0x7fc00000) : a;
        float db = amax / 127.0f;
        float id = db != 0.0f ? 1.0f / db : 0.0f;
        float r = rintf(v * id);
        int qi = (r != r) ? 0 : (int)fminf(fmaxf(r, -127.0f), 127.0f);
        int sum = qi;
        for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(FULL_MASK, sum, o);
        q[b * 32 + f8_pos(lane, q4)] = (u8)(qi & 0xff);
        if (lane == 0) {
            d[b] = db;
            s[b] = db * (float)sum;
        }
    }
}

// Parts of one launch (`F8Args` in `cuda/fast8.rs`, field for field): each
// part a matrix [n, k] of one format reading k columns of the rounded rows
// from `x_off` (a multiple of 32), writing n values a row `y_stride` apart,
// through the unary chain. `first`: the part's first unit (a warp of the
// one-row kernels, a 64-output tile of the tiled ones).
#define F8_PARTS 4
struct F8Part {
    const u32* dm;
    const u8* quants;
    float* y;
    u64 n;
    u64 first;
    u64 x_off;
    u64 y_stride;
    Chain c;
};
struct Fast8 {
    const u8* q;     // [rows, x_stride] activation bytes
    const float* d;  // [rows, x_stride / 32] block scales
    const float* s;  // [rows, x_stride / 32] d · Σ q
    u64 rows;
    u64 k;
    u64 x_stride;
    u64 parts;
    F8Part p[F8_PARTS];
};

// The part unit `g` belongs to (constant indices only: the struct stays in
// the parameter bank).
__device__ __forceinline__ F8Part f8_part(const Fast8& f, u64 g) {
    F8Part p = f.p[0];
#pragma unroll
    for (int t = 1; t < F8_PARTS; t++)
        if ((u64)t < f.parts && g >= f.p[t].first) p = f.p[t];
    return p;
}

// One round's loads of a lane (its block of the round): the activation
// bytes, the weight bytes (Q8_0: 32, Q4_1: 16), the packed scale/min and
// the row's block scale and sum.
struct F8Round {
    uint4 a0, a1, w0, w1;
    u32 dm;
    float da, sa;
};
template <int Q4>
__device__ __forceinline__ void f8_round_load(F8Round& r, const u8* qa, const float* da,
                                              const float* sa, const u32* dm, const u8* wq,
                                              u64 b) {
    r.a0 = ((const uint4*)(qa + b * 32))[0];
    r.a1 = ((const uint4*)(qa + b * 32))[1];
    r.dm = dm[b];
    r.da = da[b];
    if (Q4) {
        r.w0 = ((const uint4*)(wq + b * 16))[0];
        r.sa = sa[b];
    } else {
        r.w0 = ((const uint4*)(wq + b * 32))[0];
        r.w1 = ((const uint4*)(wq + b * 32))[1];
    }
}

// ---- one activation row (decode): a warp per output element, lane l on
// block b0 + l of each round of 32, the round's float steps in block order
// on every lane (the sums and scales passed by shuffles). The next round's
// loads are issued before this round's float steps, and a full round's
// 32 steps are unrolled (a round's steps are 32 dependent FMAs; before,
// every round's loads waited for them. Run 44: with the staged attention's
// cp.async, DeepSeek-V4's 32-layer step 12.62 -> 12.03 ms on an H100,
// same digest).
template <int Q4>
__device__ __forceinline__ void f8_one_sums(const F8Round& cur, int& sumi, float& scale,
                                            float& mw, float& sb) {
    u32 a[8] = {cur.a0.x, cur.a0.y, cur.a0.z, cur.a0.w, cur.a1.x, cur.a1.y, cur.a1.z, cur.a1.w};
    sumi = 0;
    if (Q4) {
        u32 c[4] = {cur.w0.x, cur.w0.y, cur.w0.z, cur.w0.w};
#pragma unroll
        for (int i = 0; i < 4; i++) {
            sumi = __dp4a((int)(c[i] & 0x0f0f0f0fu), (int)a[2 * i], sumi);
            sumi = __dp4a((int)((c[i] >> 4) & 0x0f0f0f0fu), (int)a[2 * i + 1], sumi);
        }
        mw = h2f((u16)(cur.dm >> 16));
        sb = cur.sa;
    } else {
        u32 c[8] = {cur.w0.x, cur.w0.y, cur.w0.z, cur.w0.w, cur.w1.x, cur.w1.y, cur.w1.z, cur.w1.w};
#pragma unroll
        for (int i = 0; i < 8; i++) sumi = __dp4a((int)c[i], (int)a[i], sumi);
        mw = 0.0f, sb = 0.0f;
    }
    scale = h2f((u16)(cur.dm & 0xffff)) * cur.da;
}

// ---- one activation row (decode): a group of eight lanes per output
// element (four a warp), lane l of a group on blocks b0 + l and b0 + 8 + l
// of each round of 16, the round's float steps in block order on every
// lane of the group (the sums and scales passed by shuffles, one shuffle
// serving the four outputs of a warp: a warp per output spent 64 shuffles
// on each 32 blocks). The next round's loads are issued before this
// round's float steps (run 45, with the routed gathers' changes of
// `kq8.cu`: DeepSeek-V4's 32-layer step 12.08 -> 11.78 ms on an H100, the
// same digest). Units (`first`, `n`) count outputs: unit g is group g % 4 of
// warp g / 4; the launch has a quarter of the units' warps (`cuda/fast8.rs`;
// any warp past them returns at once).
// Blocks a lane takes each round of `f8_one` (8 · F8_H blocks a round).
#define F8_H 2
template <int Q4>
__device__ __forceinline__ void f8_one(const Fast8& f) {
    u32 lane = threadIdx.x & 31, gi = lane / 8, li = lane % 8;
    u64 w = (u64)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    u64 total = f.p[0].first + f.p[0].n;
#pragma unroll
    for (int t = 1; t < F8_PARTS; t++)
        if ((u64)t < f.parts) total = f.p[t].first + f.p[t].n;
    if (4 * w >= total) return;
    u64 g = 4 * w + gi;
    F8Part p = f8_part(f, g < total ? g : 4 * w);
    u64 j = g - p.first;
    bool live = g < total && j < p.n;
    if (!live) j = 0;
    u64 t = blockIdx.y;
    u64 nb = f.k / 32;
    u64 at = t * f.x_stride + p.x_off;
    const u8* qa = f.q + at;
    const float* da = f.d + at / 32;
    const float* sa = f.s + at / 32;
    const u32* dm = p.dm + j * nb;
    const u8* wq = p.quants + j * nb * (Q4 ? 16 : 32);
    float acc = 0.0f;
    F8Round cur[F8_H];
#pragma unroll
    for (int h = 0; h < F8_H; h++)
        if (li + 8 * h < nb) f8_round_load<Q4>(cur[h], qa, da, sa, dm, wq, li + 8 * h);
    for (u64 b0 = 0; b0 < nb; b0 += 8 * F8_H) {
        int sumi[F8_H] = {};
        float scale[F8_H] = {}, mw[F8_H] = {}, sb[F8_H] = {};
#pragma unroll
        for (int h = 0; h < F8_H; h++)
            if (b0 + li + 8 * h < nb) f8_one_sums<Q4>(cur[h], sumi[h], scale[h], mw[h], sb[h]);
#pragma unroll
        for (int h = 0; h < F8_H; h++)
            if (b0 + 8 * F8_H + li + 8 * h < nb)
                f8_round_load<Q4>(cur[h], qa, da, sa, dm, wq, b0 + 8 * F8_H + li + 8 * h);
        u64 steps = nb - b0 < 8 * F8_H ? nb - b0 : 8 * F8_H;
        if (steps == 8 * F8_H) {
#pragma unroll
            for (int i = 0; i < 8 * F8_H; i++) {
                int src = (int)(8 * gi) + (i % 8);
                float si = (float)__shfl_sync(FULL_MASK, sumi[i / 8], src);
                acc = fmaf(__shfl_sync(FULL_MASK, scale[i / 8], src), si, acc);
                if (Q4)
                    acc = fmaf(__shfl_sync(FULL_MASK, mw[i / 8], src),
                               __shfl_sync(FULL_MASK, sb[i / 8], src), acc);
            }
        } else {
            for (u64 i = 0; i < steps; i++) {
                int src = (int)(8 * gi) + (int)(i % 8);
                bool hi = F8_H > 1 && i >= 8;
                float si = (float)__shfl_sync(FULL_MASK, hi ? sumi[F8_H - 1] : sumi[0], src);
                acc = fmaf(__shfl_sync(FULL_MASK, hi ? scale[F8_H - 1] : scale[0], src), si, acc);
                if (Q4)
                    acc = fmaf(__shfl_sync(FULL_MASK, hi ? mw[F8_H - 1] : mw[0], src),
                               __shfl_sync(FULL_MASK, hi ? sb[F8_H - 1] : sb[0], src), acc);
            }
        }
    }
    if (live && li == 0) p.y[t * p.y_stride + j] = p.c.apply(acc);
}

extern "C" __global__ void f8_one_q8_0(Fast8 f) {
    dep_entry();
    f8_one<0>(f);
}
extern "C" __global__ void f8_one_q4_1(Fast8 f) {
    dep_entry();
    f8_one<1>(f);
}

// ---- a few activation rows (verify windows, small batches): the one-row
// kernel's warp per output with R rows a warp, each weight block read once
// for the R rows (the tensor-core tiles below own 16 outputs a warp, so a
// 2-row window ran n / 16 warps over the whole k: a fifth of the one-row
// kernel's memory parallelism). Each lane computes its block's sums for
// every row and leaves them in shared memory; lane r then runs row r's
// float steps over the round's blocks in order (the one-row kernel's
// broadcast has every lane run every row's steps: R times the
// instructions). Row r's sums and float steps are `f8_one`'s for that
// row: the same bits.
#define F8_ROWS_WARPS 8
template <int Q4, int R>
__device__ __forceinline__ void f8_rows(const Fast8& f) {
    // Per warp and row: the round's 32 block scales (dw · d), sums as
    // floats, and for Q4_1 the weight minima and the rows' d · Σq.
    __shared__ float sc_s[F8_ROWS_WARPS][R][32];
    __shared__ float si_s[F8_ROWS_WARPS][R][32];
    __shared__ float sb_s[F8_ROWS_WARPS][Q4 ? R : 1][32];
    __shared__ float mw_s[F8_ROWS_WARPS][32];
    u32 w = threadIdx.x / 32, lane = threadIdx.x & 31;
    u64 g = (u64)blockIdx.x * (blockDim.x / 32) + w;
    F8Part p = f8_part(f, g);
    u64 j = g - p.first;
    if (j >= p.n) return;
    u64 r0 = (u64)blockIdx.y * R;
    if (r0 >= f.rows) return;
    int nr = f.rows - r0 < (u64)R ? (int)(f.rows - r0) : R;
    u64 nb = f.k / 32;
    const u32* dm = p.dm + j * nb;
    const u8* wq = p.quants + j * nb * (Q4 ? 16 : 32);
    float acc = 0.0f;  // row `lane`'s, for lane < nr
    for (u64 b0 = 0; b0 < nb; b0 += 32) {
        u64 b = b0 + lane;
        bool live_b = b < nb;
        u32 c[8] = {0u, 0u, 0u, 0u, 0u, 0u, 0u, 0u};
        float dw = 0.0f;
        if (live_b) {
            if (Q4) {
                uint4 wv = ((const uint4*)(wq + b * 16))[0];
                c[0] = wv.x & 0x0f0f0f0fu, c[1] = (wv.x >> 4) & 0x0f0f0f0fu;
                c[2] = wv.y & 0x0f0f0f0fu, c[3] = (wv.y >> 4) & 0x0f0f0f0fu;
                c[4] = wv.z & 0x0f0f0f0fu, c[5] = (wv.z >> 4) & 0x0f0f0f0fu;
                c[6] = wv.w & 0x0f0f0f0fu, c[7] = (wv.w >> 4) & 0x0f0f0f0fu;
            } else {
                uint4 w0 = ((const uint4*)(wq + b * 32))[0], w1 = ((const uint4*)(wq + b * 32))[1];
                c[0] = w0.x, c[1] = w0.y, c[2] = w0.z, c[3] = w0.w;
                c[4] = w1.x, c[5] = w1.y, c[6] = w1.z, c[7] = w1.w;
            }
            u32 m = dm[b];
            dw = h2f((u16)(m & 0xffff));
            if (Q4) mw_s[w][lane] = h2f((u16)(m >> 16));
        }
#pragma unroll
        for (int r = 0; r < R; r++) {
            if (r >= nr) break;
            if (live_b) {
                u64 at = (r0 + r) * f.x_stride + p.x_off;
                const uint4* xa = (const uint4*)(f.q + at + b * 32);
                uint4 a0 = xa[0], a1 = xa[1];
                u32 a[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
                int sumi = 0;
#pragma unroll
                for (int i = 0; i < 8; i++) sumi = __dp4a((int)c[i], (int)a[i], sumi);
                sc_s[w][r][lane] = dw * f.d[at / 32 + b];
                si_s[w][r][lane] = (float)sumi;
                if (Q4) sb_s[w][Q4 ? r : 0][lane] = f.s[at / 32 + b];
            }
        }
        __syncwarp();
        if ((int)lane < nr) {
            int r = (int)lane;
            u64 live = nb - b0 < 32 ? nb - b0 : 32;
            if (live == 32) {
#pragma unroll
                for (int i = 0; i < 32; i++) {
                    acc = fmaf(sc_s[w][r][i], si_s[w][r][i], acc);
                    if (Q4) acc = fmaf(mw_s[w][i], sb_s[w][Q4 ? r : 0][i], acc);
                }
            } else {
                for (u64 i = 0; i < live; i++) {
                    acc = fmaf(sc_s[w][r][i], si_s[w][r][i], acc);
                    if (Q4) acc = fmaf(mw_s[w][i], sb_s[w][Q4 ? r : 0][i], acc);
                }
            }
        }
        __syncwarp();
    }
    if ((int)lane < nr) p.y[(r0 + lane) * p.y_stride + j] = p.c.apply(acc);
}

extern "C" __global__ void f8_rows4_q8_0(Fast8 f) {
    dep_entry();
    f8_rows<0, 4>(f);
}
extern "C" __global__ void f8_rows4_q4_1(Fast8 f) {
    dep_entry();
    f8_rows<1, 4>(f);
}
extern "C" __global__ void f8_rows8_q8_0(Fast8 f) {
    dep_entry();
    f8_rows<0, 8>(f);
}
extern "C" __global__ void f8_rows8_q4_1(Fast8 f) {
    dep_entry();
    f8_rows<1, 8>(f);
}

// ---- tiles of rows on the tensor cores: a block of 4 warps owns 64
// outputs (16 a warp) and 8·NT activation rows; per weight block each warp
// runs NT `mma.sync.m16n8k32.s8` into zeroed integer accumulators (the
// block's exact sums), then the float step of that block on each of its
// accumulators. Fragments (PTX ISA, m16n8k32 .s8): lane = 4·g + c; A
// (weights, row-major 16 × 32) words {row g, bytes 4c..}, {row g + 8,
// 4c..}, {row g, 16 + 4c..}, {row g + 8, 16 + 4c..}; B (activations, 32 ×
// 8) words {row g, 4c..}, {row g, 16 + 4c..}; C: {out g, act 2c}, {g, 2c +
// 1}, {g + 8, 2c}, {g + 8, 2c + 1}.
__device__ __forceinline__ void f8_mma(int (&c)[4], const u32 (&a)[4], u32 b0, u32 b1) {
    c[0] = c[1] = c[2] = c[3] = 0;
    asm volatile(
        "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};"
        : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Weight words of lane (g, c) for block b of rows j0 (= row g) and j1
// (= row g + 8).
template <int Q4>
__device__ __forceinline__ void f8_a(u32 (&a)[4], const u8* quants, u64 nb, u64 j0, u64 j1,
                                     u64 b, u32 c) {
    if (Q4) {
        const u32* w0 = (const u32*)(quants + (j0 * nb + b) * 16);
        const u32* w1 = (const u32*)(quants + (j1 * nb + b) * 16);
        u32 sh = 4 * (c % 2);
        a[0] = (w0[c / 2] >> sh) & 0x0f0f0f0fu;
        a[1] = (w1[c / 2] >> sh) & 0x0f0f0f0fu;
        a[2] = (w0[2 + c / 2] >> sh) & 0x0f0f0f0fu;
        a[3] = (w1[2 + c / 2] >> sh) & 0x0f0f0f0fu;
    } else {
        const u32* w0 = (const u32*)(quants + (j0 * nb + b) * 32);
        const u32* w1 = (const u32*)(quants + (j1 * nb + b) * 32);
        a[0] = w0[c];
        a[1] = w1[c];
        a[2] = w0[4 + c];
        a[3] = w1[4 + c];
    }
}

// The tiles' activations go through shared memory: the block's 4 warps own
// different outputs but read the same 8·NT rounded rows and their scales,
// so each warp loading them (8 rows a fragment, each a different 32-byte
// sector) kept L1 95 % busy on a prefill chunk (run 36, `ncu-detail`).
// The block copies F8_KB blocks of its rows at a time (cp.async, the next
// stage in flight while this one is used); a staged row is F8_ROW_WORDS
// words, the 4 spare ones putting the 8 rows of a fragment's load in 8
// distinct bank groups. Only who loads changes: every integer sum and
// float step is as before, so the bits are too.
#define F8_KB 8
#define F8_ROW_WORDS (F8_KB * 8 + 4)

__device__ __forceinline__ void f8_cp4(float* smem, const float* gmem) {
    u32 s = (u32)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(s), "l"(gmem) : "memory");
}

// Stage blocks b0 .. b0 + nbk of rows r0 .. r0 + R (rows past the
// activations copy the last one, never stored) into xs / ds / ss.
template <int Q4, int R>
__device__ __forceinline__ void f8_stage(u32 (*xs)[F8_ROW_WORDS], float (*ds)[F8_KB + 1],
                                         float (*ss)[F8_KB + 1], const Fast8& f, const F8Part& p,
                                         u64 r0, u64 b0, u64 nbk) {
    u64 sb = f.x_stride / 32;
    u32 halves = (u32)nbk * 2;
    for (u32 u = threadIdx.x; u < R * halves; u += blockDim.x) {
        u32 row = u / halves, h = u % halves;
        u64 r = r0 + row < f.rows ? r0 + row : f.rows - 1;
        st_cp16((u8*)&xs[row][h * 4], f.q + p.x_off + r * f.x_stride + b0 * 32 + h * 16);
    }
    for (u32 u = threadIdx.x; u < R * (u32)nbk; u += blockDim.x) {
        u32 row = u / (u32)nbk, bb = u % (u32)nbk;
        u64 r = r0 + row < f.rows ? r0 + row : f.rows - 1;
        f8_cp4(&ds[row][bb], f.d + p.x_off / 32 + r * sb + b0 + bb);
        if (Q4) f8_cp4(&ss[row][bb], f.s + p.x_off / 32 + r * sb + b0 + bb);
    }
    st_commit();
}

template <int Q4, int NT>
__device__ __forceinline__ void f8_tiles(const Fast8& f) {
    constexpr int R = 8 * NT;
    __shared__ __align__(16) u32 xs[2][R][F8_ROW_WORDS];
    __shared__ float ds[2][R][F8_KB + 1];
    __shared__ float ss[2][Q4 ? R : 1][F8_KB + 1];
    F8Part p = f8_part(f, blockIdx.x);
    u32 warp = threadIdx.x / 32, lane = threadIdx.x & 31, g = lane / 4, c = lane % 4;
    u64 jb = (blockIdx.x - p.first) * 64 + warp * 16;
    // A warp past the part's outputs still stages and meets the barriers.
    bool live = jb < p.n;
    u64 nb = f.k / 32;
    // Rows past the matrix read the last one (never stored).
    u64 j0 = live && jb + g < p.n ? jb + g : p.n - 1;
    u64 j1 = live && jb + g + 8 < p.n ? jb + g + 8 : p.n - 1;
    for (u64 r0 = (u64)blockIdx.y * R; r0 < f.rows; r0 += (u64)gridDim.y * R) {
        float acc[NT][4];
#pragma unroll
        for (int t = 0; t < NT; t++) acc[t][0] = acc[t][1] = acc[t][2] = acc[t][3] = 0.0f;
        f8_stage<Q4, R>(xs[0], ds[0], ss[0], f, p, r0, 0, nb < F8_KB ? nb : F8_KB);
        int s = 0;
        for (u64 b0 = 0; b0 < nb; b0 += F8_KB, s ^= 1) {
            u64 nbk = nb - b0 < F8_KB ? nb - b0 : F8_KB;
            u64 next = b0 + F8_KB;
            if (next < nb) {
                u64 nk = nb - next < F8_KB ? nb - next : F8_KB;
                f8_stage<Q4, R>(xs[s ^ 1], ds[s ^ 1], ss[Q4 ? s ^ 1 : 0], f, p, r0, next, nk);
                st_wait<1>();
            } else {
                st_wait<0>();
            }
            __syncthreads();
            if (live) {
                for (u64 bb = 0; bb < nbk; bb++) {
                    u64 b = b0 + bb;
                    u32 a[4];
                    f8_a<Q4>(a, p.quants, nb, j0, j1, b, c);
                    u32 m0 = p.dm[j0 * nb + b], m1 = p.dm[j1 * nb + b];
                    float dw0 = h2f((u16)(m0 & 0xffff)), dw1 = h2f((u16)(m1 & 0xffff));
#pragma unroll
                    for (int t = 0; t < NT; t++) {
                        int sums[4];
                        const u32* xb = &xs[s][8 * t + g][bb * 8];
                        f8_mma(sums, a, xb[c], xb[4 + c]);
                        float d0 = ds[s][8 * t + 2 * c][bb], d1 = ds[s][8 * t + 2 * c + 1][bb];
                        acc[t][0] = fmaf(dw0 * d0, (float)sums[0], acc[t][0]);
                        acc[t][1] = fmaf(dw0 * d1, (float)sums[1], acc[t][1]);
                        acc[t][2] = fmaf(dw1 * d0, (float)sums[2], acc[t][2]);
                        acc[t][3] = fmaf(dw1 * d1, (float)sums[3], acc[t][3]);
                        if (Q4) {
                            float mw0 = h2f((u16)(m0 >> 16)), mw1 = h2f((u16)(m1 >> 16));
                            float s0 = ss[Q4 ? s : 0][8 * t + 2 * c][bb];
                            float s1 = ss[Q4 ? s : 0][8 * t + 2 * c + 1][bb];
                            acc[t][0] = fmaf(mw0, s0, acc[t][0]);
                            acc[t][1] = fmaf(mw0, s1, acc[t][1]);
                            acc[t][2] = fmaf(mw1, s0, acc[t][2]);
                            acc[t][3] = fmaf(mw1, s1, acc[t][3]);
                        }
                    }
                }
            }
            __syncthreads();
        }
        if (!live) continue;
#pragma unroll
        for (int t = 0; t < NT; t++) {
            u64 r = r0 + 8 * t + 2 * c;
#pragma unroll
            for (int i = 0; i < 4; i++) {
                u64 jj = jb + g + 8 * (i / 2), rr = r + (i % 2);
                if (jj < p.n && rr < f.rows) p.y[rr * p.y_stride + jj] = p.c.apply(acc[t][i]);
            }
        }
    }
}

// NT 1 (8 rows a warp) for batches of decode rows, where the outputs are
// few and the grid needs the rows' tiles; NT 4 (32 rows) for prefill.
extern "C" __global__ void f8_tiles8_q8_0(Fast8 f) {
    dep_entry();
    f8_tiles<0, 1>(f);
}
extern "C" __global__ void f8_tiles8_q4_1(Fast8 f) {
    dep_entry();
    f8_tiles<1, 1>(f);
}
extern "C" __global__ void f8_tiles32_q8_0(Fast8 f) {
    dep_entry();
    f8_tiles<0, 4>(f);
}
extern "C" __global__ void f8_tiles32_q4_1(Fast8 f) {
    dep_entry();
    f8_tiles<1, 4>(f);
}
