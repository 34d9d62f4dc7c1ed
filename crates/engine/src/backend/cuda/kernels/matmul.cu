// Row-independent matrix products, y[r, j] = Σ_i x[r, i]·w[j, i].
//
// Eight threads own one output column j (a weight row) and walk every
// activation row of the call, four at a time (the weights are read once per
// four rows). Thread l of the eight accumulates the indices ≡ l (mod 8) in
// order with FMA, and the eight partial sums are added
// ((a0+a4)+(a2+a6))+((a1+a5)+(a3+a7)), then the tail below 8 runs in order
// on thread 0: exactly the CPU reference's sequence (`cpu::f32_matmul::dot`),
// so an f32 product has the CPU's bits, and the bits of y[r, j] never depend
// on how many rows the call had.
//
// Block formats (Q8_0, Q4_1) have an order of their own (below): a warp per
// output row, which streams the quants at a much higher rate than eight
// threads could.

#define MM_TILE 4

__device__ __forceinline__ unsigned group_mask() { return 0xffu << (threadIdx.x & 24); }

// ((a0+a4)+(a2+a6))+((a1+a5)+(a3+a7)) across the 8 lanes of a group; lane 0
// of the group holds the result.
__device__ __forceinline__ float group8_sum(float a, unsigned mask) {
    a += __shfl_xor_sync(mask, a, 4);
    a += __shfl_xor_sync(mask, a, 2);
    a += __shfl_xor_sync(mask, a, 1);
    return a;
}

// Output column j (weight row `wr`) of every row: x's rows `x_stride`
// apart, y's `y_stride` apart.
__device__ __forceinline__ void mm_f32_column(float* y, const float* x, u64 rows,
                                              const float* wr, u64 j, u64 k, u64 x_stride,
                                              u64 y_stride) {
    unsigned lane = threadIdx.x & 7, mask = group_mask();
    u64 k8 = k / 8 * 8;
    for (u64 r0 = 0; r0 < rows; r0 += MM_TILE) {
        u64 nr = rows - r0 < MM_TILE ? rows - r0 : MM_TILE;
        const float* xr = x + r0 * x_stride;
        float acc[MM_TILE] = {};
#pragma unroll 4
        for (u64 c = lane; c < k8; c += 8) {
            float wv = wr[c];
#pragma unroll
            for (int t = 0; t < MM_TILE; t++)
                if (t < nr) acc[t] = fmaf(wv, xr[t * x_stride + c], acc[t]);
        }
#pragma unroll
        for (int t = 0; t < MM_TILE; t++) {
            float s = group8_sum(acc[t], mask);
            if (lane == 0 && t < nr) {
                for (u64 i = k8; i < k; i++) s = fmaf(wr[i], xr[t * x_stride + i], s);
                y[(r0 + t) * y_stride + j] = s;
            }
        }
    }
}

extern "C" __global__ void matmul_f32(float* y, const float* x, u64 rows, const float* w, u64 n,
                                      u64 k) {
    dep_entry();
    u64 j = (u64)blockIdx.x * (blockDim.x / 8) + threadIdx.x / 8;
    if (j >= n) return;
    mm_f32_column(y, x, rows, w + j * k, j, k, k, n);
}

// A block-diagonal product of f32 matrices (`Backend::matmul_grouped`):
// group h's columns of x (`x + h·k`, rows `x_stride` apart) times its own
// matrix `w[h]` ([n, k]) into group h's columns of y (`y + h·n`, rows
// `y_stride` apart); grid.y walks the groups of the launch. Each output is
// `matmul_f32`'s sequence (`mm_f32_column`), so it has the bits of splitting
// the columns, `matmul_f32` per group and joining (MLA's per-head
// absorption: 64 heads of [512, 256] were 64 launches of 8–16 blocks and
// two copies each, two thirds of GLM-5's step in run 45).
#define GF32_GROUPS 64
struct GroupedF32 {
    float* y;
    const float* x;
    u64 rows;
    u64 n;
    u64 k;
    u64 x_stride;
    u64 y_stride;
    const float* w[GF32_GROUPS];
};

extern "C" __global__ void matmul_f32_grouped(GroupedF32 a) {
    dep_entry();
    u64 j = (u64)blockIdx.x * (blockDim.x / 8) + threadIdx.x / 8;
    if (j >= a.n) return;
    u32 h = blockIdx.y;
    // Constant indices only (the struct stays in the parameter bank).
    const float* w = a.w[0];
#pragma unroll
    for (u32 t = 1; t < GF32_GROUPS; t++)
        if (t == h) w = a.w[t];
    mm_f32_column(a.y + h * a.n, a.x + h * a.k, a.rows, w + j * a.k, j, a.k, a.x_stride,
                  a.y_stride);
}

// Routed experts: pair p (a (token, slot)) multiplies x row p / x_div by
// expert experts[p] of the stack w [E, n, k]; y: [pairs, n]. Pairs run over
// grid.y; each output is the f32 product above.
extern "C" __global__ void matmul_f32_gather(float* y, const float* x, u64 x_div,
                                             const u32* experts, u64 pairs, const float* w,
                                             u64 n, u64 k) {
    dep_entry();
    u64 j = (u64)blockIdx.x * (blockDim.x / 8) + threadIdx.x / 8;
    if (j >= n) return;
    unsigned lane = threadIdx.x & 7, mask = group_mask();
    u64 k8 = k / 8 * 8;
    for (u64 p = blockIdx.y; p < pairs; p += gridDim.y) {
        const float* wr = w + ((u64)experts[p] * n + j) * k;
        const float* xr = x + (p / x_div) * k;
        float acc = 0.f;
#pragma unroll 4
        for (u64 c = lane; c < k8; c += 8) acc = fmaf(wr[c], xr[c], acc);
        float s = group8_sum(acc, mask);
        if (lane == 0) {
            for (u64 i = k8; i < k; i++) s = fmaf(wr[i], xr[i], s);
            y[p * n + j] = s;
        }
    }
}

// out[r, h] = Σ_s weights[r, s]·ys[r·k + s, h], slots in order from 0.
extern "C" __global__ void experts_combine(float* out, const float* ys, const float* weights,
                                           u64 rows, u64 top_k, u64 h) {
    dep_entry();
    FOR_EACH(i, rows * h) {
        u64 r = i / h, e = i % h;
        float o = 0.0f;
        for (u64 s = 0; s < top_k; s++) o += weights[r * top_k + s] * ys[(r * top_k + s) * h + e];
        out[i] = o;
    }
}

// Expert parallel (`Backend::experts_slots`): a shard holds experts
// first .. first + count. `local[p]` is slot p's expert in the shard's
// stack, or 0 where another shard owns it: such a slot runs expert 0's
// product and is zeroed after (`experts_zero_unowned`), so every owned
// slot keeps the one-device kernel, hence its bits.
extern "C" __global__ void experts_local_ids(u32* local, const u32* experts, u64 pairs,
                                             u64 first, u64 count) {
    dep_entry();
    FOR_EACH(p, pairs) {
        u64 e = experts[p];
        local[p] = (e >= first && e < first + count) ? (u32)(e - first) : 0u;
    }
}

// `ys[p, :] = 0` for every slot p whose expert lies outside first .. first + count.
extern "C" __global__ void experts_zero_unowned(float* ys, const u32* experts, u64 pairs, u64 h,
                                                u64 first, u64 count) {
    dep_entry();
    FOR_EACH(i, pairs * h) {
        u64 e = experts[i / h];
        if (e < first || e >= first + count) ys[i] = 0.0f;
    }
}

// `experts_combine`, plus a gated shared expert: base + shared·σ(gate[r]),
// each step rounded as `add_gated_rows_f32` rounds it (one launch instead
// of two).
extern "C" __global__ void experts_combine_gated(float* out, const float* ys,
                                                 const float* weights, u64 rows, u64 top_k,
                                                 u64 h, const float* shared, const float* gate) {
    dep_entry();
    FOR_EACH(i, rows * h) {
        u64 r = i / h, e = i % h;
        float o = 0.0f;
        for (u64 s = 0; s < top_k; s++) o += weights[r * top_k + s] * ys[(r * top_k + s) * h + e];
        float g = 1.0f / (expf(-gate[r]) + 1.0f);
        float t = shared[i] * g;
        out[i] = o + t;
    }
}

// Block formats, one warp per output row, eight blocks per step: lane l
// takes block b0 + l/4 and its quarter l%4 (elements 8·(l%4) .. +8), so the
// warp reads 8 consecutive blocks of quants and 256 consecutive activations
// per step (coalesced). Each weight is dequantized exactly as GGUF defines
// it (Q4_1: u·d + m, u·d exact; Q8_0: q·d, exact) and accumulated by FMA
// into the lane's sum, in element order within the quarter and block
// order across steps; the 32 lane sums are added by the butterfly
// (`warp_sum`). The order depends on k alone. Device layout: `dm` holds
// each block's f16 scale (low half) and, for Q4_1, its f16 minimum (high
// half), `[n, k/32]`; `quants` `[n, k/32, 16 or 32]`.

// Steps whose quants and scales a one-row product (decode, the expert
// gathers) loads before it uses any of them: a warp walks its row's steps
// one after another, and with one load in flight per step a short row
// (k = 2560: ten steps) waited out ten DRAM latencies. Loading ahead
// changes only when a value arrives, never the order of any lane's FMAs,
// so the bits are those of one step at a time. Products of several rows
// (prefill, verify windows) load one step at a time: with two steps ahead
// there, prefill ran 11% slower (run 15, `docs/GPU.md`), as run 12's
// unrolled loop had. Four steps ahead beat eight (run 15).
#define MM_AHEAD 4

// The eight weights of lane `qtr`'s quarter of a block, dequantized.
// The quant becomes a float without an int-to-float conversion (a quarter-
// or sixteenth-rate instruction, which bounded the big one-row products
// by arithmetic rather than memory): its bits OR'ed into the mantissa of
// 2^23 give 2^23 + q exactly, and subtracting 2^23 (Q8_0: 2^23 + 128 from
// 2^23 + (q + 128)) leaves q exactly, so every weight has the value, and
// every product the bits, of the plain conversion.
//
// Q4_1 quants are stored as one word per block quarter (`weights.rs`,
// `repack`): element 8·qtr + i in bits 4i .. 4i + 3. A nibble is masked in
// place at bit 0, 4 or 8 of the word or of the word shifted by 12 or 24
// (one `lop3` masks it and ORs in 2^23), so the float is q·16^j, and its
// scale d·16^-j (exact: a power of two times an f16 value), so the product
// is q·d exactly as before. q·d is exact (4 × 11 significant bits), so one
// fused u·d + m rounds as the FMUL-then-FADD of GGUF's u·d + m does: every
// weight keeps its bits, with 4 instructions a weight instead of 7.
#define MAGIC_2_23 8388608.0f
template <u32 MASK>
__device__ __forceinline__ float nib_float(u32 v, u32 magic) {
    u32 r;
    asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(r) : "r"(v), "n"(MASK), "r"(magic));
    return __int_as_float(r) - MAGIC_2_23;
}
template <int Q4>
__device__ __forceinline__ void dequant8(float w[8], uint2 q, u32 sm, unsigned qtr) {
    if (Q4) {
        float d = h2f((u16)(sm & 0xffff)), m = h2f((u16)(sm >> 16));
        float d4 = d * 0.0625f, d8 = d * 0.00390625f;
        const u32 magic = 0x4B000000u;
        u32 v0 = q.x, v1 = q.x >> 12, v2 = q.x >> 24;
        w[0] = fmaf(nib_float<0x00f>(v0, magic), d, m);
        w[1] = fmaf(nib_float<0x0f0>(v0, magic), d4, m);
        w[2] = fmaf(nib_float<0xf00>(v0, magic), d8, m);
        w[3] = fmaf(nib_float<0x00f>(v1, magic), d, m);
        w[4] = fmaf(nib_float<0x0f0>(v1, magic), d4, m);
        w[5] = fmaf(nib_float<0xf00>(v1, magic), d8, m);
        w[6] = fmaf(nib_float<0x00f>(v2, magic), d, m);
        w[7] = fmaf(nib_float<0x0f0>(v2, magic), d4, m);
    } else {
        float d = h2f((u16)(sm & 0xffff));
#pragma unroll
        for (int i = 0; i < 8; i++) {
            u32 biased = (((i < 4 ? q.x : q.y) >> (8 * (i % 4))) & 0xff) ^ 0x80u;
            float v = __int_as_float(0x4B000000u | biased) - (MAGIC_2_23 + 128.0f);
            w[i] = v * d;
        }
    }
}

// This lane's quants of block b (`dequant8`'s q): Q4_1 the quarter's word,
// Q8_0 the quarter's eight bytes.
template <int Q4>
__device__ __forceinline__ uint2 lane_quants(const u8* qr, u64 b, unsigned qtr) {
    uint2 q;
    if (Q4) {
        q.x = *(const u32*)(qr + b * 16 + qtr * 4);
        q.y = 0;
    } else {
        q = *(const uint2*)(qr + b * 32 + qtr * 8);
    }
    return q;
}

// a + Σ w_i·v_i by FMA in element order (a lane's eight weights of a block
// quarter against their activations).
__device__ __forceinline__ float fma8(float a, const float w[8], float4 v0, float4 v1) {
    a = fmaf(w[0], v0.x, a);
    a = fmaf(w[1], v0.y, a);
    a = fmaf(w[2], v0.z, a);
    a = fmaf(w[3], v0.w, a);
    a = fmaf(w[4], v1.x, a);
    a = fmaf(w[5], v1.y, a);
    a = fmaf(w[6], v1.z, a);
    a = fmaf(w[7], v1.w, a);
    return a;
}

// acc[t] (t < nr) += this lane's share of row `dmr`/`qr` times activation
// row t of `xr`, over the eight-block steps starting at block `b_first`,
// `b_stride` blocks apart, in order: the one loop of every block-format
// product (`matmul_block`, `matmul_block_split`, `matmul_block_gather`),
// `AHEAD` steps loaded at a time.
template <int Q4, int T, int AHEAD>
__device__ __forceinline__ void block_steps(float (&acc)[T], u64 nr, const float* xr, u64 k,
                                            const u32* dmr, const u8* qr, u64 nb, u64 b_first,
                                            u64 b_stride, unsigned lane) {
    unsigned qtr = lane & 3;
    for (u64 b0 = b_first + lane / 4; b0 < nb; b0 += b_stride * AHEAD) {
        uint2 q[AHEAD];
        u32 sm[AHEAD];
#pragma unroll
        for (int u = 0; u < AHEAD; u++) {
            u64 b = b0 + u * b_stride;
            if (b < nb) {
                q[u] = lane_quants<Q4>(qr, b, qtr);
                sm[u] = dmr[b];
            }
        }
#pragma unroll
        for (int u = 0; u < AHEAD; u++) {
            u64 b = b0 + u * b_stride;
            if (b < nb) {
                float w[8];
                dequant8<Q4>(w, q[u], sm[u], qtr);
#pragma unroll
                for (int t = 0; t < T; t++) {
                    if (t < nr) {
                        const float4* xb = (const float4*)(xr + t * k + b * 32 + qtr * 8);
                        acc[t] = fma8(acc[t], w, xb[0], xb[1]);
                    }
                }
            }
        }
    }
}

// `block_steps` for one activation row and R weight rows at once (a SwiGLU's
// gate and up rows, a mix's stream gates): the loads of all R rows are in
// flight together and each activation value is loaded once for them, but
// every row's lane sum takes the FMAs of `block_steps` in the same order,
// so each row has the bits of its own product.
template <int Q4, int R, int AHEAD>
__device__ __forceinline__ void block_steps_rows(float (&acc)[R], const float* x,
                                                 const u32* const (&dmr)[R],
                                                 const u8* const (&qr)[R], u64 nb,
                                                 unsigned lane) {
    unsigned qtr = lane & 3;
    for (u64 b0 = lane / 4; b0 < nb; b0 += 8 * AHEAD) {
        uint2 q[R][AHEAD];
        u32 sm[R][AHEAD];
#pragma unroll
        for (int u = 0; u < AHEAD; u++) {
            u64 b = b0 + u * 8;
#pragma unroll
            for (int r = 0; r < R; r++) {
                if (b < nb) {
                    q[r][u] = lane_quants<Q4>(qr[r], b, qtr);
                    sm[r][u] = dmr[r][b];
                }
            }
        }
#pragma unroll
        for (int u = 0; u < AHEAD; u++) {
            u64 b = b0 + u * 8;
            if (b < nb) {
                const float4* xb = (const float4*)(x + b * 32 + qtr * 8);
                float4 v0 = xb[0], v1 = xb[1];
#pragma unroll
                for (int r = 0; r < R; r++) {
                    float w[8];
                    dequant8<Q4>(w, q[r][u], sm[r][u], qtr);
                    acc[r] = fma8(acc[r], w, v0, v1);
                }
            }
        }
    }
}

// Several activation rows (prefill, verify windows): a warp per output row,
// the rows four at a time, one step loaded at a time.
template <int Q4>
__device__ __forceinline__ void matmul_block(float* y, const float* x, u64 rows, const u32* dm,
                                             const u8* quants, u64 n, u64 k) {
    const int qb = Q4 ? 16 : 32;
    u64 j = (u64)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (j >= n) return;
    unsigned lane = threadIdx.x & 31;
    u64 nb = k / 32;
    const u32* dmr = dm + j * nb;
    const u8* qr = quants + j * nb * qb;
    for (u64 r0 = 0; r0 < rows; r0 += MM_TILE) {
        u64 nr = rows - r0 < MM_TILE ? rows - r0 : MM_TILE;
        float acc[MM_TILE] = {};
        block_steps<Q4, MM_TILE, 1>(acc, nr, x + r0 * k, k, dmr, qr, nb, 0, 8, lane);
#pragma unroll
        for (int t = 0; t < MM_TILE; t++) {
            float s = warp_sum(acc[t]);
            if (lane == 0 && t < nr) y[(r0 + t) * n + j] = s;
        }
    }
}

// The warp sums of weight rows r0 and r1 (of [·, k], nb = k/32 blocks)
// against x, their loads in lockstep (`block_steps_rows`: each row in
// `block_steps`' FMA order, so each sum has the bits of its own warp).
template <int Q4>
__device__ __forceinline__ float2 two_row_sums(const float* x, const u32* dm, const u8* quants,
                                               u64 nb, u64 r0, u64 r1, unsigned lane) {
    const int qb = Q4 ? 16 : 32;
    const u32* const dmr[2] = {dm + r0 * nb, dm + r1 * nb};
    const u8* const qr[2] = {quants + r0 * nb * qb, quants + r1 * nb * qb};
    float acc[2] = {0.f, 0.f};
    block_steps_rows<Q4, 2, MM_AHEAD>(acc, x, dmr, qr, nb, lane);
    float2 s;
    s.x = warp_sum(acc[0]);
    s.y = warp_sum(acc[1]);
    return s;
}


// The warp sums of weight rows r[0..4) against x, their loads in lockstep
// (`block_steps_rows`: each row in `block_steps`' FMA order, so each sum
// has the bits of its own warp). The routed down products (k = 640: three
// steps a row) spent a warp's fixed costs on two rows each; four per warp
// decode 1.01–1.03× (run 19).
template <int Q4>
__device__ __forceinline__ float4 four_row_sums(const float* x, const u32* dm, const u8* quants,
                                                u64 nb, const u64 (&r)[4], unsigned lane) {
    const int qb = Q4 ? 16 : 32;
    const u32* const dmr[4] = {dm + r[0] * nb, dm + r[1] * nb, dm + r[2] * nb, dm + r[3] * nb};
    const u8* const qr[4] = {quants + r[0] * nb * qb, quants + r[1] * nb * qb,
                             quants + r[2] * nb * qb, quants + r[3] * nb * qb};
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
    block_steps_rows<Q4, 4, MM_AHEAD>(acc, x, dmr, qr, nb, lane);
    float4 s;
    s.x = warp_sum(acc[0]);
    s.y = warp_sum(acc[1]);
    s.z = warp_sum(acc[2]);
    s.w = warp_sum(acc[3]);
    return s;
}

// Every one-row kernel (`_one`, `_split_one`, `_many*`, `_gated_mean`) takes
// its activation row from blockIdx.y: a decode step launches one row of
// blocks, and a verify window's 2..=4 rows (`cuda/window_rows.rs`) one per
// row, so a window has the bits of single steps and the launches of one;
// its rows run concurrently, so rows after the first find most weights in
// L2. Run 21 (`docs/GPU.md`): K = 1 1.32–1.36 one-row forwards, against
// 1.73–1.75 in the several-row kernels and 1.55 in kernels taking four
// output rows a warp against every row (each weight read once, but half
// the warps in flight).
// One activation row (decode): two output rows per warp (`two_row_sums`;
// the launch gives ⌈n/2⌉ warps, `ONE_ROWS` in `cuda/linear.rs`), MM_AHEAD
// steps loaded ahead; the bits of `matmul_block`. The stored value goes
// through the caller's unary chain first (`Backend::matmul_unary`; the
// steps of `unary_chain_f32`, so the bits of the two launches), which
// saves a launch per gated projection. A kernel of its own because a
// kernel's register count is set by its heaviest path: with both paths in
// one kernel every launch ran at the occupancy of the heavier one (run 16,
// `docs/GPU.md`: prefill 1.01×, decode 1.00–1.03×). Run 16's two or four
// rows per warp (decode 0.93× and 0.88×) read the rows one after another;
// run 17's two, loaded together, decode as fast as one row per warp and
// prefill 341 → 347 tok/s (the routed products). Eight steps ahead was
// slower (0.97×, run 16).
template <int Q4>
__device__ __forceinline__ void matmul_block_one(float* y, const float* x, const u32* dm,
                                                 const u8* quants, u64 n, u64 k, Chain c) {
    u64 j0 = 2 * ((u64)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32);
    if (j0 >= n) return;
    u64 j1 = j0 + 1 < n ? j0 + 1 : j0;
    float2 s = two_row_sums<Q4>(x, dm, quants, k / 32, j0, j1, threadIdx.x & 31);
    if ((threadIdx.x & 31) == 0) {
        y[j0] = c.apply(s.x);
        if (j1 != j0) y[j1] = c.apply(s.y);
    }
}

// Long block-format matrices (k ≥ 4096: the hyper-connection mixers'
// [4, 10240] and [320, 10240], the [2560, 6144] output projections), where
// a warp per output row left much of the GPU idle: a block of MM_SPLIT
// warps per output row, warp w taking the eight-block steps ≡ w (mod
// MM_SPLIT) in order with `matmul_block`'s lane arithmetic, each warp's
// butterfly, then the MM_SPLIT warp sums in warp order from +0. The order
// depends on k alone (the launch picks this kernel by k, never by the row
// count), so every row count gives the same bits.
// `ONE`: the one-row form (a kernel of its own, as `matmul_block_one`).
#define MM_SPLIT 8

// One activation row of the split form: warp w's steps, its butterfly, the
// MM_SPLIT warp sums in warp order from +0 through `part` (a shared
// [MM_SPLIT][MM_TILE] array; column 0 is used). Every thread of the block
// calls it; thread 0 holds the sum. Shared by `matmul_block_split` and
// `matmul_block_split_many`, so both store the same bits.
template <int Q4>
__device__ __forceinline__ float split_row_one(float* part, const float* x, u64 k,
                                               const u32* dmr, const u8* qr, u64 nb) {
    unsigned warp = threadIdx.x / 32, lane = threadIdx.x & 31;
    float one[1] = {0.f};
    block_steps<Q4, 1, MM_AHEAD>(one, 1, x, k, dmr, qr, nb, 8 * (u64)warp, 8 * MM_SPLIT, lane);
    float s = warp_sum(one[0]);
    if (lane == 0) part[warp * MM_TILE] = s;
    __syncthreads();
    float sum = 0.0f;
    if (threadIdx.x == 0)
        for (int w = 0; w < MM_SPLIT; w++) sum += part[w * MM_TILE];
    return sum;
}

template <int Q4, int ONE>
__device__ __forceinline__ void matmul_block_split(float* y, const float* x, u64 rows,
                                                   const u32* dm, const u8* quants, u64 n,
                                                   u64 k, Chain c) {
    __shared__ float part[MM_SPLIT][MM_TILE];
    const int qb = Q4 ? 16 : 32;
    unsigned warp = threadIdx.x / 32, lane = threadIdx.x & 31;
    u64 nb = k / 32;
    for (u64 j = blockIdx.x; j < n; j += gridDim.x) {
        const u32* dmr = dm + j * nb;
        const u8* qr = quants + j * nb * qb;
        for (u64 r0 = 0; r0 < rows; r0 += MM_TILE) {
            u64 nr = rows - r0 < MM_TILE ? rows - r0 : MM_TILE;
            if (ONE) {
                float s = split_row_one<Q4>(&part[0][0], x, k, dmr, qr, nb);
                if (threadIdx.x == 0) y[j] = c.apply(s);
                __syncthreads();
                continue;
            }
            float acc[MM_TILE] = {};
            block_steps<Q4, MM_TILE, 1>(acc, nr, x + r0 * k, k, dmr, qr, nb, 8 * (u64)warp,
                                        8 * MM_SPLIT, lane);
#pragma unroll
            for (int t = 0; t < MM_TILE; t++) {
                float s = warp_sum(acc[t]);
                if (lane == 0) part[warp][t] = s;
            }
            __syncthreads();
            if (threadIdx.x < nr) {
                float s = 0.0f;
                for (int w = 0; w < MM_SPLIT; w++) s += part[w][threadIdx.x];
                y[(r0 + threadIdx.x) * n + j] = c.apply(s);
            }
            __syncthreads();
        }
    }
}

extern "C" __global__ void matmul_q4_1_split(float* y, const float* x, u64 rows, const u32* dm,
                                             const u8* quants, u64 n, u64 k) {
    dep_entry();
    matmul_block_split<1, 0>(y, x, rows, dm, quants, n, k, Chain{0, {}, {}, {}});
}

extern "C" __global__ void matmul_q4_1_split_one(float* y, const float* x, const u32* dm,
                                                 const u8* quants, u64 n, u64 k, int steps,
                                                 int k0, float a0, float b0, int k1, float a1,
                                                 float b1, int k2, float a2, float b2, int k3,
                                                 float a3, float b3) {
    dep_entry();
    Chain c{steps, {k0, k1, k2, k3}, {a0, a1, a2, a3}, {b0, b1, b2, b3}};
    matmul_block_split<1, 1>(y + blockIdx.y * n, x + blockIdx.y * k, 1, dm, quants, n, k, c);
}

extern "C" __global__ void matmul_q8_0_split(float* y, const float* x, u64 rows, const u32* dm,
                                             const u8* quants, u64 n, u64 k) {
    dep_entry();
    matmul_block_split<0, 0>(y, x, rows, dm, quants, n, k, Chain{0, {}, {}, {}});
}

extern "C" __global__ void matmul_q8_0_split_one(float* y, const float* x, const u32* dm,
                                                 const u8* quants, u64 n, u64 k, int steps,
                                                 int k0, float a0, float b0, int k1, float a1,
                                                 float b1, int k2, float a2, float b2, int k3,
                                                 float a3, float b3) {
    dep_entry();
    Chain c{steps, {k0, k1, k2, k3}, {a0, a1, a2, a3}, {b0, b1, b2, b3}};
    matmul_block_split<0, 1>(y + blockIdx.y * n, x + blockIdx.y * k, 1, dm, quants, n, k, c);
}

extern "C" __global__ void matmul_q4_1(float* y, const float* x, u64 rows, const u32* dm,
                                       const u8* quants, u64 n, u64 k) {
    dep_entry();
    matmul_block<1>(y, x, rows, dm, quants, n, k);
}

extern "C" __global__ void matmul_q8_0(float* y, const float* x, u64 rows, const u32* dm,
                                       const u8* quants, u64 n, u64 k) {
    dep_entry();
    matmul_block<0>(y, x, rows, dm, quants, n, k);
}

extern "C" __global__ void matmul_q4_1_one(float* y, const float* x, const u32* dm,
                                           const u8* quants, u64 n, u64 k, int steps, int k0,
                                           float a0, float b0, int k1, float a1, float b1, int k2,
                                           float a2, float b2, int k3, float a3, float b3) {
    dep_entry();
    Chain c{steps, {k0, k1, k2, k3}, {a0, a1, a2, a3}, {b0, b1, b2, b3}};
    matmul_block_one<1>(y + blockIdx.y * n, x + blockIdx.y * k, dm, quants, n, k, c);
}

extern "C" __global__ void matmul_q8_0_one(float* y, const float* x, const u32* dm,
                                           const u8* quants, u64 n, u64 k, int steps, int k0,
                                           float a0, float b0, int k1, float a1, float b1, int k2,
                                           float a2, float b2, int k3, float a3, float b3) {
    dep_entry();
    Chain c{steps, {k0, k1, k2, k3}, {a0, a1, a2, a3}, {b0, b1, b2, b3}};
    matmul_block_one<0>(y + blockIdx.y * n, x + blockIdx.y * k, dm, quants, n, k, c);
}

// Several products of one activation row in one launch
// (`Backend::matmul_many`): part i multiplies x by its own matrix (the same
// k and block format, and the kernel form `matmul` picks for each alone),
// its warps (split form: blocks) numbered from `first` in the launch. Each
// output runs the code of that part's own launch (`block_steps` with
// MM_AHEAD, the butterfly, `split_row_one` for the split form, the chain
// as it stores), so it has that launch's bits. A grouped launch
// (`Backend::matmul_grouped`) gives each part its own columns of x
// (`x_off`, rows `x_stride` apart) and of one output (`y_stride`). A SwiGLU part (rows
// [g | u], 2·I of them) has a warp per j < I computing rows j and I + j
// and storing `swiglu_one(g_j, u_j)`, as `swiglu_f32` does. The fields
// mirror `ManyArgs` in `cuda/linear.rs` (repr(C)).
#define MANY_PARTS 4
struct ManyPart {
    const u32* dm;
    const u8* quants;
    float* y;
    u64 n;         // outputs of the part (I for a SwiGLU part)
    u64 first;     // its first warp (split form: block) in the launch
    u64 x_off;     // its first column of x
    u64 y_stride;  // values between its output rows
    int swiglu;
    int has_limit;
    float limit;
    Chain c;
};
struct Many {
    const float* x;
    u64 k;
    u64 x_stride;  // values between rows of x
    u64 parts;
    ManyPart p[MANY_PARTS];
};

// The part unit `g` (a warp, or a block in the split form) belongs to,
// selected with constant indices only (the struct stays in the parameter
// bank).
__device__ __forceinline__ ManyPart many_part(const Many& m, u64 g) {
    ManyPart p = m.p[0];
#pragma unroll
    for (int t = 1; t < MANY_PARTS; t++)
        if ((u64)t < m.parts && g >= m.p[t].first) p = m.p[t];
    return p;
}

// `SWIGLU`: the launch has SwiGLU parts (a kernel of its own: the two-row
// path's registers would lower every other launch's occupancy).
// `t`: the activation row (blockIdx.y, see below).
template <int Q4, int SWIGLU>
__device__ __forceinline__ void matmul_block_many(const Many& m, u64 t) {
    const int qb = Q4 ? 16 : 32;
    u64 g = (u64)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    ManyPart p = many_part(m, g);
    u64 j = g - p.first;
    if (j >= p.n) return;
    unsigned lane = threadIdx.x & 31;
    u64 nb = m.k / 32;
    const float* x = m.x + t * m.x_stride + p.x_off;
    float* y = p.y + t * p.y_stride;
    if (SWIGLU && p.swiglu) {
        float2 gu = two_row_sums<Q4>(x, p.dm, p.quants, nb, j, p.n + j, lane);
        if (lane == 0) y[j] = swiglu_one(gu.x, gu.y, p.has_limit, p.limit);
        return;
    }
    float acc[1] = {0.f};
    block_steps<Q4, 1, MM_AHEAD>(acc, 1, x, m.k, p.dm + j * nb, p.quants + j * nb * qb, nb, 0, 8,
                                 lane);
    float s = warp_sum(acc[0]);
    if (lane == 0) y[j] = p.c.apply(s);
}

template <int Q4>
__device__ __forceinline__ void matmul_block_split_many(const Many& m, u64 t) {
    __shared__ float part[MM_SPLIT][MM_TILE];
    const int qb = Q4 ? 16 : 32;
    ManyPart p = many_part(m, blockIdx.x);
    u64 j = blockIdx.x - p.first;
    if (j >= p.n) return;
    u64 nb = m.k / 32;
    float s = split_row_one<Q4>(&part[0][0], m.x + t * m.x_stride + p.x_off, m.k, p.dm + j * nb,
                                p.quants + j * nb * qb, nb);
    if (threadIdx.x == 0) p.y[t * p.y_stride + j] = p.c.apply(s);
}

extern "C" __global__ void matmul_q4_1_many(Many m) {
    dep_entry();
    matmul_block_many<1, 0>(m, blockIdx.y);
}
extern "C" __global__ void matmul_q8_0_many(Many m) {
    dep_entry();
    matmul_block_many<0, 0>(m, blockIdx.y);
}
extern "C" __global__ void matmul_q4_1_many_swiglu(Many m) {
    dep_entry();
    matmul_block_many<1, 1>(m, blockIdx.y);
}
extern "C" __global__ void matmul_q8_0_many_swiglu(Many m) {
    dep_entry();
    matmul_block_many<0, 1>(m, blockIdx.y);
}
extern "C" __global__ void matmul_q4_1_split_many(Many m) {
    dep_entry();
    matmul_block_split_many<1>(m, blockIdx.y);
}
extern "C" __global__ void matmul_q8_0_split_many(Many m) {
    dep_entry();
    matmul_block_split_many<0>(m, blockIdx.y);
}

// The gated-residual mix with its gates as a product, one activation row
// (`Backend::matmul_gated_mean`): a warp per output column j < h computes
// the gate rows s·h + j of w [c·h, k] (s < c ≤ MEAN_STREAMS) with
// `matmul_block_one`'s code, then the mean of σ(g_s)·streams[s·h + j] in
// stream order as `gated_mean_streams_f32` does: the bits of the product
// then the mix.
#define MEAN_STREAMS 8
template <int Q4>
__device__ __forceinline__ void matmul_block_gated_mean(float* y, const float* x, const u32* dm,
                                                        const u8* quants, const float* streams,
                                                        u64 c, u64 h, u64 k, float inv) {
    const int qb = Q4 ? 16 : 32;
    u64 j = (u64)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (j >= h) return;
    unsigned lane = threadIdx.x & 31;
    u64 nb = k / 32;
    // The stream gates four rows at a time, their loads in flight
    // together (`block_steps_rows`, two steps ahead: a mix's k = 320 is
    // ten blocks, two steps).
    // The streams loaded before the gates (they do not depend on them): a
    // load after the gates' butterflies was one more memory latency at the
    // end of every launch (decode 1.01×, run 19).
    float g[MEAN_STREAMS], sv[MEAN_STREAMS];
#pragma unroll
    for (int st = 0; st < MEAN_STREAMS; st++) sv[st] = (u64)st < c ? streams[st * h + j] : 0.0f;
#pragma unroll
    for (int s0 = 0; s0 < MEAN_STREAMS; s0 += 4) {
        if ((u64)s0 < c) {
            const u32* dmr[4];
            const u8* qr[4];
#pragma unroll
            for (int r = 0; r < 4; r++) {
                // Rows past c repeat the last one (computed, not used).
                u64 row = ((u64)(s0 + r) < c ? s0 + r : c - 1) * h + j;
                dmr[r] = dm + row * nb;
                qr[r] = quants + row * nb * qb;
            }
            float acc[4] = {0.f, 0.f, 0.f, 0.f};
            block_steps_rows<Q4, 4, 2>(acc, x, dmr, qr, nb, lane);
#pragma unroll
            for (int r = 0; r < 4; r++) g[s0 + r] = warp_sum(acc[r]);
        }
    }
    if (lane == 0) {
        float s = 0.0f;
#pragma unroll
        for (int st = 0; st < MEAN_STREAMS; st++) {
            if ((u64)st < c) {
                float m = 1.0f / (expf(-g[st]) + 1.0f);
                s += m * sv[st];
            }
        }
        y[j] = s * inv + 0.0f;
    }
}

extern "C" __global__ void matmul_q4_1_gated_mean(float* y, const float* x, const u32* dm,
                                                  const u8* quants, const float* streams, u64 c,
                                                  u64 h, u64 k, float inv) {
    dep_entry();
    u64 t = blockIdx.y;
    matmul_block_gated_mean<1>(y + t * h, x + t * k, dm, quants, streams + t * c * h, c, h, k,
                               inv);
}

extern "C" __global__ void matmul_q8_0_gated_mean(float* y, const float* x, const u32* dm,
                                                  const u8* quants, const float* streams, u64 c,
                                                  u64 h, u64 k, float inv) {
    dep_entry();
    u64 t = blockIdx.y;
    matmul_block_gated_mean<0>(y + t * h, x + t * k, dm, quants, streams + t * c * h, c, h, k,
                               inv);
}

// Routed experts in a block format: pair p (a (token, slot)) multiplies x
// row p / x_div by expert experts[p] of the stack [E, n, k]; y: [pairs, n].
// Pairs run over grid.y, four output rows per warp, each in the order of
// `matmul_block` for one activation row, so a routed product has the bits
// of a `matmul` by that expert's matrix. `SWIGLU`: the stack's rows are
// [g | u] (n = 2·I), a warp per j < I computes rows j and I + j and stores
// `swiglu_one(g_j, u_j)` to y [pairs, I], as `swiglu_f32` would from the
// plain product (one launch instead of two).
template <int Q4, int SWIGLU>
__device__ __forceinline__ void matmul_block_gather(float* y, const float* x, u64 x_div,
                                                    const u32* experts, u64 pairs,
                                                    const u32* dm, const u8* quants, u64 n,
                                                    u64 k, int has_limit, float limit) {
    u64 j = (u64)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    u64 outs = SWIGLU ? n / 2 : n;
    if (j >= outs) return;
    unsigned lane = threadIdx.x & 31;
    u64 nb = k / 32;
    for (u64 p = blockIdx.y; p < pairs; p += gridDim.y) {
        u64 row = (u64)experts[p] * n + j;
        const float* xr = x + (p / x_div) * k;
        if (SWIGLU) {
            float2 gu = two_row_sums<Q4>(xr, dm, quants, nb, row, row + outs, lane);
            if (lane == 0) y[p * outs + j] = swiglu_one(gu.x, gu.y, has_limit, limit);
        } else {
            // Rows 4j .. 4j + 3 (`four_row_sums`; the launch gives
            // ⌈n/4⌉ warps, `GATHER_ROWS` in `cuda/linear.rs`).
            u64 j0 = 4 * j;
            if (j0 >= n) return;
            u64 e = (u64)experts[p] * n;
            u64 r[4];
            for (int i = 0; i < 4; i++) r[i] = e + (j0 + i < n ? j0 + i : n - 1);
            float4 s = four_row_sums<Q4>(xr, dm, quants, nb, r, lane);
            if (lane == 0) {
                y[p * n + j0] = s.x;
                if (j0 + 1 < n) y[p * n + j0 + 1] = s.y;
                if (j0 + 2 < n) y[p * n + j0 + 2] = s.z;
                if (j0 + 3 < n) y[p * n + j0 + 3] = s.w;
            }
        }
    }
}

extern "C" __global__ void matmul_q4_1_gather(float* y, const float* x, u64 x_div,
                                              const u32* experts, u64 pairs, const u32* dm,
                                              const u8* quants, u64 n, u64 k) {
    dep_entry();
    matmul_block_gather<1, 0>(y, x, x_div, experts, pairs, dm, quants, n, k, 0, 0.0f);
}

extern "C" __global__ void matmul_q8_0_gather(float* y, const float* x, u64 x_div,
                                              const u32* experts, u64 pairs, const u32* dm,
                                              const u8* quants, u64 n, u64 k) {
    dep_entry();
    matmul_block_gather<0, 0>(y, x, x_div, experts, pairs, dm, quants, n, k, 0, 0.0f);
}

extern "C" __global__ void matmul_q4_1_gather_swiglu(float* y, const float* x, u64 x_div,
                                                     const u32* experts, u64 pairs,
                                                     const u32* dm, const u8* quants, u64 n,
                                                     u64 k, int has_limit, float limit) {
    dep_entry();
    matmul_block_gather<1, 1>(y, x, x_div, experts, pairs, dm, quants, n, k, has_limit, limit);
}

extern "C" __global__ void matmul_q8_0_gather_swiglu(float* y, const float* x, u64 x_div,
                                                     const u32* experts, u64 pairs,
                                                     const u32* dm, const u8* quants, u64 n,
                                                     u64 k, int has_limit, float limit) {
    dep_entry();
    matmul_block_gather<0, 1>(y, x, x_div, experts, pairs, dm, quants, n, k, has_limit, limit);
}
