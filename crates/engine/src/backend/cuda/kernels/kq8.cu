// The fast kernel set's products for the 256-value super-block types
// (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ2_XXS): activations rounded to int8 per
// super-block (ggml's Q8_K), weights read in place in their integer form,
// integer dot products on `dp4a`. The arithmetic is the CPU fast set's
// (`cpu/kq8_matmul/mod.rs`, its scalar kernel the definition), so every
// output has the CPU fast kernels' bits:
//
// - a row's super-block b: `da = amax / 127`, `q = rint(x · (1 / da))`
//   clamped to ±127 (0 for a NaN; every q 0 when da is 0);
// - per output element, over the super-blocks in order from acc = 0:
//   `acc = fma(d · da, (float)sumi, acc)`, then for the types with minima
//   `acc = fma(−(dmin · da), (float)summ, acc)`, where `sumi = Σ_s sc[s] ·
//   Σ_{i∈s} w_i q_i` and `summ = Σ_s m[s] · Σ_{i∈s} q_i` are exact integers
//   (so any lane split and reduction order gives the same ones).
//
// A warp owns one output element per activation row: its four groups of
// eight lanes take four super-blocks at a time, each lane 32 values (one
// 32-value sub-block, or two of 16), the eight lanes' integer sums meet
// by shuffles, and every lane then runs the float steps of the four blocks
// in block order (the same values on every lane). The bits depend on the
// weight row and the activation row alone: the same for every row count,
// tile, window and routed pair. Sources are joined in order: this file
// uses `stored.cu`'s IQ2_XXS tables.

typedef signed char i8;

#define KQ 256

// (`KQ_HOST`: the format decoders alone, for the host check in
// docs/gpu-logs/30-kq8-emu.cpp.)
#ifndef KQ_HOST

// Round `blocks` super-blocks of x (contiguous) into q (bytes) and d (one
// f32 each): a warp per super-block, lane l on values 8l .. 8l + 7.
extern "C" __global__ void kq8_quantize(u8* q, float* d, const float* x, u64 blocks) {
    dep_entry();
    u64 lane = threadIdx.x & 31;
    u64 warp = ((u64)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    u64 warps = ((u64)gridDim.x * blockDim.x) >> 5;
    for (u64 b = warp; b < blocks; b += warps) {
        const float4* xb = (const float4*)(x + b * KQ + lane * 8);
        float4 v0 = xb[0], v1 = xb[1];
        float v[8] = {v0.x, v0.y, v0.z, v0.w, v1.x, v1.y, v1.z, v1.w};
        // amax with the CPU fold's NaN rule: any NaN makes it NaN (which
        // NaN is not kept: NaN outputs are NaN, not bit-compared).
        float a = 0.0f;
        bool nan = false;
#pragma unroll
        for (int i = 0; i < 8; i++) {
            float t = fabsf(v[i]);
            if (t != t) nan = true;
            else if (t > a) a = t;
        }
        a = warp_max(a);
        nan = __any_sync(FULL_MASK, nan);
        float amax = nan ? __int_as_float(0x7fc00000) : a;
        float db = amax / 127.0f;
        float id = db != 0.0f ? 1.0f / db : 0.0f;
        u32 packed[2] = {0u, 0u};
#pragma unroll
        for (int i = 0; i < 8; i++) {
            float t = rintf(v[i] * id);
            int qi = (t != t) ? 0 : (int)fminf(fmaxf(t, -127.0f), 127.0f);
            packed[i / 4] |= ((u32)qi & 0xffu) << (8 * (i % 4));
        }
        *(uint2*)(q + b * KQ + lane * 8) = make_uint2(packed[0], packed[1]);
        if (lane == 0) d[b] = db;
    }
}

#endif  // KQ_HOST

// A 32-bit little-endian word at any byte address (two aligned words and a
// funnel shift; the weights carry padding past their last row).
__device__ __forceinline__ u32 kq_ld32(const u8* p) {
    u64 a = (u64)p;
    const u32* base = (const u32*)(a & ~(u64)3);
    return __funnelshift_r(base[0], base[1], (u32)(a & 3) * 8);
}

__device__ __forceinline__ u32 kq_u16(const u8* p) { return (u32)p[0] | ((u32)p[1] << 8); }

// One lane's share of a super-block: 32 weights as signed bytes in eight
// words (value 4i + j in byte j of word i), the scale and min of each of
// its two 16-value sub-blocks (both the same for 32-value sub-blocks).
struct KqPart {
    u32 w[8];
    int sc0, sc1, m0, m1;
};

// Per format: block bytes, whether it has minima, whether its sub-blocks
// are 16 values, and the decode of part p (values 32p .. 32p + 31) of the
// block at b; `scales(b, d, dmin)` reads the block's f32 scales.

struct KqQ2K {
    enum { BB = 84, MIN = 1 };
    static __device__ __forceinline__ void part(const u8* b, u32 p, KqPart& o) {
        u32 half = p / 4, j = p % 4;
        const u8* qs = b + 16 + 32 * half;
#pragma unroll
        // Q2_K's words lie 4-aligned wherever its rows do (84-byte blocks):
        // one load each there, the funnel shift's two elsewhere.
        if (((u64)qs & 3) == 0) {
#pragma unroll
            for (int i = 0; i < 8; i++)
                o.w[i] = (((const u32*)qs)[i] >> (2 * j)) & 0x03030303u;
        } else {
#pragma unroll
            for (int i = 0; i < 8; i++) o.w[i] = (kq_ld32(qs + 4 * i) >> (2 * j)) & 0x03030303u;
        }
        u32 s0 = b[2 * p], s1 = b[2 * p + 1];
        o.sc0 = s0 & 15, o.m0 = s0 >> 4, o.sc1 = s1 & 15, o.m1 = s1 >> 4;
    }
    static __device__ __forceinline__ void scales(const u8* b, float& d, float& dmin) {
        d = h2f((u16)kq_u16(b + 80));
        dmin = h2f((u16)kq_u16(b + 82));
    }
};

__device__ __forceinline__ int kq_q3_scale(const u8* sc, u32 s) {
    u32 low = s < 8 ? (sc[s] & 15u) : (sc[s - 8] >> 4);
    u32 high = (sc[8 + s % 4] >> (2 * (s / 4))) & 3u;
    return (int)(low | (high << 4)) - 32;
}

struct KqQ3K {
    enum { BB = 110, MIN = 0 };
    static __device__ __forceinline__ void part(const u8* b, u32 p, KqPart& o) {
        u32 half = p / 4, j = p % 4;
        const u8* qs = b + 32 + 32 * half;
#pragma unroll
        for (int i = 0; i < 8; i++) {
            u32 low = (kq_ld32(qs + 4 * i) >> (2 * j)) & 0x03030303u;
            u32 high = (kq_ld32(b + 4 * i) >> (4 * half + j)) & 0x01010101u;
            // low − 4 where the high bit is clear, low where it is set.
            o.w[i] = __vsub4(low | (high << 2), 0x04040404u);
        }
        o.sc0 = kq_q3_scale(b + 96, 2 * p);
        o.sc1 = kq_q3_scale(b + 96, 2 * p + 1);
        o.m0 = o.m1 = 0;
    }
    static __device__ __forceinline__ void scales(const u8* b, float& d, float& dmin) {
        d = h2f((u16)kq_u16(b + 108));
        dmin = 0.0f;
    }
};

__device__ __forceinline__ void kq_scale_min_k4(const u8* q, u32 j, int& s, int& m) {
    if (j < 4) {
        s = q[j] & 63, m = q[j + 4] & 63;
    } else {
        s = (q[j + 4] & 15) | ((q[j - 4] >> 6) << 4);
        m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

template <int FIVE>
struct KqQ45K {
    enum { BB = FIVE ? 176 : 144, MIN = 1 };
    static __device__ __forceinline__ void part(const u8* b, u32 p, KqPart& o) {
        const u8* qs = b + (FIVE ? 48 : 16) + 32 * (p / 2);
#pragma unroll
        for (int i = 0; i < 8; i++) {
            u32 w = (kq_ld32(qs + 4 * i) >> (4 * (p % 2))) & 0x0f0f0f0fu;
            if (FIVE) w |= ((kq_ld32(b + 16 + 4 * i) >> p) & 0x01010101u) << 4;
            o.w[i] = w;
        }
        int s, m;
        kq_scale_min_k4(b + 4, p, s, m);
        o.sc0 = o.sc1 = s, o.m0 = o.m1 = m;
    }
    static __device__ __forceinline__ void scales(const u8* b, float& d, float& dmin) {
        d = h2f((u16)kq_u16(b));
        dmin = h2f((u16)kq_u16(b + 2));
    }
};

struct KqQ6K {
    enum { BB = 210, MIN = 0 };
    static __device__ __forceinline__ void part(const u8* b, u32 p, KqPart& o) {
        u32 half = p / 4, t = p % 4;
        const u8* ql = b + 64 * half + 32 * (t % 2);
        const u8* qh = b + 128 + 32 * half;
#pragma unroll
        for (int i = 0; i < 8; i++) {
            u32 low = (kq_ld32(ql + 4 * i) >> (4 * (t / 2))) & 0x0f0f0f0fu;
            u32 high = ((kq_ld32(qh + 4 * i) >> (2 * t)) & 0x03030303u) << 4;
            o.w[i] = __vsub4(low | high, 0x20202020u);
        }
        o.sc0 = (int)(i8)b[192 + 2 * p];
        o.sc1 = (int)(i8)b[192 + 2 * p + 1];
        o.m0 = o.m1 = 0;
    }
    static __device__ __forceinline__ void scales(const u8* b, float& d, float& dmin) {
        d = h2f((u16)kq_u16(b + 208));
        dmin = 0.0f;
    }
};

// Sign bits 0..3 of `nib` as bytes 0x00 / 0xff.
__device__ __forceinline__ u32 kq_sign_bytes(u32 nib) {
    return ((nib * 0x00204081u) & 0x01010101u) * 0xffu;
}

// IQ2_XXS's grid and sign tables, read with a different index on every
// lane: from constant memory those reads serialize (one address a cycle;
// run 30 measured the product at 4 % of the copy bandwidth), so the IQ2_XXS
// kernels copy them into shared memory first (`kq_iq2_tables`), from
// global memory (`stored.cu` keeps them there: the copy's 128 threads read
// 128 addresses at once, where from constant memory they too serialized,
// once a block of four outputs in the routed gathers).
#ifdef KQ_HOST
#define KQ_IQ2_GRID st_iq2xxs_grid
#define KQ_IQ2_SIGNS st_ksigns_iq2xs
#else
__shared__ u64 kq_iq2_grid_s[256];
__shared__ u8 kq_iq2_signs_s[128];
#define KQ_IQ2_GRID kq_iq2_grid_s
#define KQ_IQ2_SIGNS kq_iq2_signs_s
__device__ __forceinline__ void kq_iq2_tables() {
    for (u32 i = threadIdx.x; i < 256; i += blockDim.x) kq_iq2_grid_s[i] = st_iq2xxs_grid[i];
    for (u32 i = threadIdx.x; i < 128; i += blockDim.x) kq_iq2_signs_s[i] = st_ksigns_iq2xs[i];
    __syncthreads();
}
#endif

struct KqIq2xxs {
    enum { BB = 66, MIN = 0 };
    static __device__ __forceinline__ void part(const u8* b, u32 p, KqPart& o) {
        const u8* g = b + 2 + 8 * p;
        u32 idx = kq_ld32(g), aux1 = kq_ld32(g + 4);
#pragma unroll
        for (int l = 0; l < 4; l++) {
            u64 grid = KQ_IQ2_GRID[(idx >> (8 * l)) & 255u];
            u32 signs = KQ_IQ2_SIGNS[(aux1 >> (7 * l)) & 127u];
            u32 lo = kq_sign_bytes(signs & 15u), hi = kq_sign_bytes(signs >> 4);
            // (mag ^ mask) − mask per byte: −mag where the sign bit is set.
            o.w[2 * l] = __vsub4((u32)grid ^ lo, lo);
            o.w[2 * l + 1] = __vsub4((u32)(grid >> 32) ^ hi, hi);
        }
        o.sc0 = o.sc1 = 2 * (int)(aux1 >> 28) + 1;
        o.m0 = o.m1 = 0;
    }
    static __device__ __forceinline__ void scales(const u8* b, float& d, float& dmin) {
        // d / 8, exact: the scale of (2s + 1) · grid.
        d = h2f((u16)kq_u16(b)) * 0.125f;
        dmin = 0.0f;
    }
};

// The integer sums of one lane's 32 values against its activation bytes
// `a` (eight words, value 4i + j in byte j of word i).
__device__ __forceinline__ void kq_lane_sums(const KqPart& o, const u32 (&a)[8], int& sumi,
                                             int& summ) {
    int d0 = 0, d1 = 0, q0 = 0, q1 = 0;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        d0 = __dp4a((int)o.w[i], (int)a[i], d0);
        q0 = __dp4a((int)a[i], 0x01010101, q0);
    }
#pragma unroll
    for (int i = 4; i < 8; i++) {
        d1 = __dp4a((int)o.w[i], (int)a[i], d1);
        q1 = __dp4a((int)a[i], 0x01010101, q1);
    }
    sumi = o.sc0 * d0 + o.sc1 * d1;
    summ = o.m0 * q0 + o.m1 * q1;
}

#ifndef KQ_HOST
// Sum over the eight lanes of a group (exact: integers).
__device__ __forceinline__ int kq_group_sum(int v) {
    v += __shfl_xor_sync(FULL_MASK, v, 4);
    v += __shfl_xor_sync(FULL_MASK, v, 2);
    v += __shfl_xor_sync(FULL_MASK, v, 1);
    return v;
}

__device__ __forceinline__ void kq_load_act(const u8* q, u32 (&a)[8]) {
    uint4 lo = ((const uint4*)q)[0], hi = ((const uint4*)q)[1];
    a[0] = lo.x, a[1] = lo.y, a[2] = lo.z, a[3] = lo.w;
    a[4] = hi.x, a[5] = hi.y, a[6] = hi.z, a[7] = hi.w;
}

// A round's float steps: the integer sums of each group of eight lanes
// (group j on block b0 + j) met, then, in block order on every lane, each
// block's `acc = fma(d · da, sumi, acc)` and, for the formats with minima,
// `acc = fma(−(dmin · da), summ, acc)` (with TAIL only the blocks below
// nb: whole rounds skip the test, which cost 14 registers). Formats
// without minima shuffle neither their q sums nor minima (constant zeros:
// the compiler keeps such shuffles, and a divergence check before each).
template <class F, bool TAIL>
__device__ __forceinline__ float kq_round_steps(int sumi, int summ, float d, float dmin,
                                                const float* da, u64 b0, u64 nb, float acc) {
    sumi = kq_group_sum(sumi);
    if (F::MIN) summ = kq_group_sum(summ);
#pragma unroll
    for (int j = 0; j < 4; j++) {
        int si = __shfl_sync(FULL_MASK, sumi, 8 * j);
        int sm = F::MIN ? __shfl_sync(FULL_MASK, summ, 8 * j) : 0;
        float dj = __shfl_sync(FULL_MASK, d, 8 * j);
        float mj = F::MIN ? __shfl_sync(FULL_MASK, dmin, 8 * j) : 0.0f;
        if (!TAIL || b0 + j < nb) {
            float a = da[b0 + j];
            acc = fmaf(dj * a, (float)si, acc);
            if (F::MIN) acc = fmaf(-(mj * a), (float)sm, acc);
        }
    }
    return acc;
}

// One output element for R activation rows: `wrow` the weight row's
// blocks, `qa[r]` / `da[r]` row r's bytes and super-block scales (rows
// past `nr` are skipped). Every lane returns the same accumulators.
template <class F, int R>
__device__ __forceinline__ void kq_dot_from(const u8* wrow, const u8* const (&qa)[R],
                                            const float* const (&da)[R], int nr, u64 nb,
                                            u64 from, float init, float (&acc)[R]) {
    u32 lane = threadIdx.x & 31, g = lane / 8, p = lane % 8;
#pragma unroll
    for (int r = 0; r < R; r++) acc[r] = init;
    for (u64 b0 = from; b0 < nb; b0 += 4) {
        u64 b = b0 + g;
        bool live = b < nb;
        KqPart o;
        float d = 0.0f, dmin = 0.0f;
        if (live) {
            const u8* blk = wrow + b * F::BB;
            F::part(blk, p, o);
            F::scales(blk, d, dmin);
        }
#pragma unroll
        for (int r = 0; r < R; r++) {
            if (r >= nr) break;
            int sumi = 0, summ = 0;
            if (live) {
                u32 a[8];
                kq_load_act(qa[r] + b * KQ + 32 * p, a);
                kq_lane_sums(o, a, sumi, summ);
            }
            acc[r] = kq_round_steps<F, true>(sumi, summ, d, dmin, da[r], b0, nb, acc[r]);
        }
    }
}

template <class F, int R>
__device__ __forceinline__ void kq_dot(const u8* wrow, const u8* const (&qa)[R],
                                       const float* const (&da)[R], int nr, u64 nb,
                                       float (&acc)[R]) {
    kq_dot_from<F, R>(wrow, qa, da, nr, nb, 0, 0.0f, acc);
}

// `kq_dot` for one activation row with four rounds (16 blocks) at a time:
// every weight load of the four issued before any of their sums (a warp
// of a routed product owns one short row: IQ2_XXS gate / up rows are 16
// blocks, so `kq_dot` waited on memory once a round). The same integer
// sums and the same float steps in block order, so the same bits.
template <class F>
__device__ __forceinline__ float kq_dot1(const u8* wrow, const u8* qa, const float* da,
                                         u64 nb) {
    u32 lane = threadIdx.x & 31, g = lane / 8, p = lane % 8;
    float acc = 0.0f;
    u64 b0 = 0;
    for (; b0 + 16 <= nb; b0 += 16) {
        KqPart o[4];
        float d[4], dmin[4];
#pragma unroll
        for (int r = 0; r < 4; r++) {
            const u8* blk = wrow + (b0 + 4 * r + g) * F::BB;
            F::part(blk, p, o[r]);
            F::scales(blk, d[r], dmin[r]);
        }
#pragma unroll
        for (int r = 0; r < 4; r++) {
            u64 b = b0 + 4 * r + g;
            u32 a[8];
            kq_load_act(qa + b * KQ + 32 * p, a);
            int sumi, summ;
            kq_lane_sums(o[r], a, sumi, summ);
            // Whole rounds: no block past nb.
            acc = kq_round_steps<F, false>(sumi, summ, d[r], dmin[r], da, b0 + 4 * r, nb, acc);
        }
    }
    if (b0 < nb) {
        const u8* const qs[1] = {qa};
        const float* const ds[1] = {da};
        // The rest from block b0 on, continuing the same accumulator.
        float rest[1];
        kq_dot_from<F, 1>(wrow, qs, ds, 1, nb, b0, acc, rest);
        acc = rest[0];
    }
    return acc;
}

// Rows of a product launch's tile (grid.y walks the tiles).
#define KQ_TILE 4

// y[rows, n] = x · wᵀ with x already rounded (q, d): a warp per output
// element and tile of KQ_TILE activation rows (blocks of 4 warps).
template <class F, int R>
__device__ __forceinline__ void kq_matmul(float* y, const u8* q, const float* d, u64 rows,
                                          const u8* w, u64 n, u64 k) {
    u64 nb = k / KQ;
    u64 row_bytes = nb * F::BB;
    u32 lane = threadIdx.x & 31;
    for (u64 j = (u64)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32; j < n;
         j += (u64)gridDim.x * (blockDim.x / 32)) {
        for (u64 r0 = (u64)blockIdx.y * R; r0 < rows; r0 += (u64)gridDim.y * R) {
            const u8* qa[R];
            const float* da[R];
#pragma unroll
            for (int r = 0; r < R; r++) {
                u64 rr = r0 + r < rows ? r0 + r : r0;
                qa[r] = q + rr * k;
                da[r] = d + rr * nb;
            }
            int nr = (int)(rows - r0 < (u64)R ? rows - r0 : (u64)R);
            float acc[R];
            kq_dot<F, R>(w + j * row_bytes, qa, da, nr, nb, acc);
            if (lane == 0) {
#pragma unroll
                for (int r = 0; r < R; r++)
                    if (r < nr) y[(r0 + r) * n + j] = acc[r];
            }
        }
    }
}

// Routed products: y[p, j] = W_{experts[p]}[j] · x[p / x_div], a warp per
// (output element, pair).
template <class F>
__device__ __forceinline__ void kq_gather(float* y, const u8* q, const float* d, u64 x_div,
                                          const u32* experts, u64 pairs, const u8* w, u64 n,
                                          u64 k) {
    u64 nb = k / KQ;
    u64 row_bytes = nb * F::BB;
    u32 lane = threadIdx.x & 31;
    for (u64 p = blockIdx.y; p < pairs; p += gridDim.y) {
        u64 xr = p / x_div;
        const u8* qa[1] = {q + xr * k};
        const float* da[1] = {d + xr * nb};
        u64 e = experts[p];
        for (u64 j = (u64)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32; j < n;
             j += (u64)gridDim.x * (blockDim.x / 32)) {
            float acc[1];
            const u8* wrow = w + (e * n + j) * row_bytes;
            // The whole row asked of L2 first (a hint, no registers): the
            // rounds of `kq_dot` then wait on L2 rather than each on DRAM
            // (run 43: DeepSeek-V4's 32-layer step 12.56 -> 12.43 ms on
            // an H200, same digest; loads ahead in registers, run 39,
            // halved the occupancy instead).
            prefetch_l2(wrow, row_bytes, lane, 32);
            // Four rounds at once for IQ2_XXS (its rows are short and its
            // part small); the wide parts of the K-quants would halve the
            // occupancy for it.
            if (F::BB == 66) acc[0] = kq_dot1<F>(wrow, qa[0], da[0], nb);
            else kq_dot<F, 1>(wrow, qa, da, 1, nb, acc);
            if (lane == 0) y[p * n + j] = acc[0];
        }
    }
}

// ---- the kernels, three per format (`cuda/stored.rs` names them):
// kq8_matmul_one_* (one activation row a warp: decode), kq8_matmul_*
// (tiles of KQ_TILE rows), kq8_gather_* (routed pairs).
extern "C" __global__ void kq8_matmul_one_q2_k(float* y, const u8* q, const float* d,
        u64 rows, const u8* w, u64 n, u64 k) {
    dep_entry();
    kq_matmul<KqQ2K, 1>(y, q, d, rows, w, n, k);
}
extern "C" __global__ void kq8_matmul_q2_k(float* y, const u8* q, const float* d, u64 rows,
        const u8* w, u64 n, u64 k) {
    dep_entry();
    kq_matmul<KqQ2K, KQ_TILE>(y, q, d, rows, w, n, k);
}
extern "C" __global__ void kq8_gather_q2_k(float* y, const u8* q, const float* d, u64 x_div,
        const u32* experts, u64 pairs, const u8* w, u64 n, u64 k) {
    dep_entry();
    kq_gather<KqQ2K>(y, q, d, x_div, experts, pairs, w, n, k);
}

extern "C" __global__ void kq8_matmul_one_q3_k(float* y, const u8* q, const float* d,
        u64 rows, const u8* w, u64 n, u64 k) {
    dep_entry();
    kq_matmul<KqQ3K, 1>(y, q, d, rows, w, n, k);
}
extern "C" __global__ void kq8_matmul_q3_k(float* y, const u8* q, const float* d, u64 rows,
        const u8* w, u64 n, u64 k) {
    dep_entry();
    kq_matmul<KqQ3K, KQ_TILE>(y, q, d, rows, w, n, k);
}
extern "C" __global__ void kq8_gather_q3_k(float* y, const u8* q, const float* d, u64 x_div,
        const u32* experts, u64 pairs, const u8* w, u64 n, u64 k) {
    dep_entry();
    kq_gather<KqQ3K>(y, q, d, x_div, experts, pairs, w, n, k);
}

extern "C" __global__ void kq8_matmul_one_q4_k(float* y, const u8* q, const float* d,
        u64 rows, const u8* w, u64 n, u64 k) {
    dep_entry();
    kq_matmul<KqQ45K<0>, 1>(y, q, d, rows, w, n, k);
}
extern "C" __global__ void kq8_matmul_q4_k(float* y, const u8* q, const float* d, u64 rows,
        const u8* w, u64 n, u64 k) {
    dep_entry();
    kq_matmul<KqQ45K<0>, KQ_TILE>(y, q, d, rows, w, n, k);
}
extern "C" __global__ void kq8_gather_q4_k(float* y, const u8* q, const float* d, u64 x_div,
        const u32* experts, u64 pairs, const u8* w, u64 n, u64 k) {
    dep_entry();
    kq_gather<KqQ45K<0>>(y, q, d, x_div, experts, pairs, w, n, k);
}

extern "C" __global__ void kq8_matmul_one_q5_k(float* y, const u8* q, const float* d,
        u64 rows, const u8* w, u64 n, u64 k) {
    dep_entry();
    kq_matmul<KqQ45K<1>, 1>(y, q, d, rows, w, n, k);
}
extern "C" __global__ void kq8_matmul_q5_k(float* y, const u8* q, const float* d, u64 rows,
        const u8* w, u64 n, u64 k) {
    dep_entry();
    kq_matmul<KqQ45K<1>, KQ_TILE>(y, q, d, rows, w, n, k);
}
extern "C" __global__ void kq8_gather_q5_k(float* y, const u8* q, const float* d, u64 x_div,
        const u32* experts, u64 pairs, const u8* w, u64 n, u64 k) {
    dep_entry();
    kq_gather<KqQ45K<1>>(y, q, d, x_div, experts, pairs, w, n, k);
}

extern "C" __global__ void kq8_matmul_one_q6_k(float* y, const u8* q, const float* d,
        u64 rows, const u8* w, u64 n, u64 k) {
    dep_entry();
    kq_matmul<KqQ6K, 1>(y, q, d, rows, w, n, k);
}
extern "C" __global__ void kq8_matmul_q6_k(float* y, const u8* q, const float* d, u64 rows,
        const u8* w, u64 n, u64 k) {
    dep_entry();
    kq_matmul<KqQ6K, KQ_TILE>(y, q, d, rows, w, n, k);
}
extern "C" __global__ void kq8_gather_q6_k(float* y, const u8* q, const float* d, u64 x_div,
        const u32* experts, u64 pairs, const u8* w, u64 n, u64 k) {
    dep_entry();
    kq_gather<KqQ6K>(y, q, d, x_div, experts, pairs, w, n, k);
}

extern "C" __global__ void kq8_matmul_one_iq2_xxs(float* y, const u8* q, const float* d,
        u64 rows, const u8* w, u64 n, u64 k) {
    dep_entry();
    kq_iq2_tables();
    kq_matmul<KqIq2xxs, 1>(y, q, d, rows, w, n, k);
}
extern "C" __global__ void kq8_matmul_iq2_xxs(float* y, const u8* q, const float* d, u64 rows,
        const u8* w, u64 n, u64 k) {
    dep_entry();
    kq_iq2_tables();
    kq_matmul<KqIq2xxs, KQ_TILE>(y, q, d, rows, w, n, k);
}
extern "C" __global__ void kq8_gather_iq2_xxs(float* y, const u8* q, const float* d, u64 x_div,
        const u32* experts, u64 pairs, const u8* w, u64 n, u64 k) {
    dep_entry();
    kq_iq2_tables();
    kq_gather<KqIq2xxs>(y, q, d, x_div, experts, pairs, w, n, k);
}
#endif  // KQ_HOST
