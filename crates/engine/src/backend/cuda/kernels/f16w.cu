// The fast kernel set's products over 16-bit float weights (F16, BF16):
// `Backend::matmul` and routed expert products (`cuda/stored.rs`
// `fast16_kernels`), with f32 activations.
//
// Why: the reference set keeps the CPU's order for these (`stored.cu`: 8
// lanes an output, each walking k / 8 values in turn), which leaves a
// decode row's product 8 chains an output deep and one computing warp a
// block: run 46's DeepSeek-V4 step had its F16 products (router, the
// compressors' and the indexer's projections) at 197–756 GB/s, 152
// launches and 2.1 ms of 16.2 under ncu. Here a warp owns an output, so a
// 256-output router is 256 warps, each lane with eight 16-byte words of
// weights in flight.
//
// The order (the fast set's own, rule 6 of `shared/specs/backend.md`): an
// output's sum walks 8-value units, lane l the units u ≡ l (mod 32) in
// order and a unit's 8 values in order (fmaf), then `warp_sum`'s fixed
// butterfly. It depends on k alone: never on the row count, the grid, the
// outputs or rows a warp takes, nor on whether the row is a routed pair's
// (each (row, output) sum is the same sequence whichever kernel below runs
// it), so a row has the same bits in a decode step, a verify window, a
// prefill chunk and a batch. k must be a multiple of 8 (`stored.rs` runs the
// reference kernels otherwise, for every row count alike), rows of x and w
// start on 16 bytes.

#define F16W_WARPS 8
static_assert(F16W_WARPS * 32 == 256, "the launch bounds below are F16W_WARPS * 32");

// The 8 weights of one 16-byte word (also `hc_fn.cu`'s).
struct F16wHalf {
    static __device__ __forceinline__ void unpack(uint4 q, float (&v)[8]) {
        u32 words[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
        for (int c = 0; c < 4; c++) {
            v[2 * c] = h2f((u16)(words[c] & 0xffffu));
            v[2 * c + 1] = h2f((u16)(words[c] >> 16));
        }
    }
};
struct F16wBf16 {
    static __device__ __forceinline__ void unpack(uint4 q, float (&v)[8]) {
        u32 words[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
        for (int c = 0; c < 4; c++) {
            v[2 * c] = __uint_as_float(words[c] << 16);
            v[2 * c + 1] = __uint_as_float(words[c] & 0xffff0000u);
        }
    }
};

// A weight word read once: not kept in L1.
__device__ __forceinline__ uint4 f16w_load(const uint4* p) {
    uint4 q;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(q.x), "=r"(q.y), "=r"(q.z), "=r"(q.w)
                 : "l"(p));
    return q;
}

// acc[o][t] += unit u of weight row wr[o] · unit u of activation row
// xr + t·k (t < nr), the unit's values in order.
template <class W, int O, int R>
__device__ __forceinline__ void f16w_unit(float (&acc)[O][R], const uint4 (&q)[O],
                                          const float* xr, u64 k, u64 nr, u64 u) {
    float v[O][8];
#pragma unroll
    for (int o = 0; o < O; o++) W::unpack(q[o], v[o]);
#pragma unroll
    for (int t = 0; t < R; t++) {
        if ((u64)t >= nr) break;
        const float4* xp = (const float4*)(xr + t * k + 8 * u);
        float4 a = xp[0], b = xp[1];
        float xv[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
        for (int o = 0; o < O; o++)
#pragma unroll
            for (int e = 0; e < 8; e++) acc[o][t] = fmaf(v[o][e], xv[e], acc[o][t]);
    }
}

// Lane l's chains for weight rows wr[o] (o < O) and activation rows xr + t·k
// (t < nr), AHEAD units a round loaded before any is added.
template <class W, int O, int R, int AHEAD>
__device__ __forceinline__ void f16w_chains(float (&acc)[O][R], const uint4* const (&wr)[O],
                                            const float* xr, u64 k, u64 nr, unsigned l) {
    u64 units = k / 8;
    u64 u = l;
    for (; u + 32 * (AHEAD - 1) < units; u += 32 * AHEAD) {
        uint4 q[AHEAD][O];
#pragma unroll
        for (int a = 0; a < AHEAD; a++)
#pragma unroll
            for (int o = 0; o < O; o++) q[a][o] = f16w_load(wr[o] + u + 32 * a);
#pragma unroll
        for (int a = 0; a < AHEAD; a++) f16w_unit<W, O, R>(acc, q[a], xr, k, nr, u + 32 * a);
    }
    for (; u < units; u += 32) {
        uint4 q[O];
#pragma unroll
        for (int o = 0; o < O; o++) q[o] = f16w_load(wr[o] + u);
        f16w_unit<W, O, R>(acc, q, xr, k, nr, u);
    }
}

// y[r, j] = x[r] · w[j]: warp (blockIdx.x · F16W_WARPS + warp) owns outputs
// O·that .. + O, row tiles of R along grid.y. Every lane of a warp takes
// part in its butterflies, so a warp past n or a tile past the rows still
// runs its (predicated) loop to the end of the tile.
template <class W, int O, int R, int AHEAD>
__device__ __forceinline__ void f16w_matmul(float* y, const float* x, u64 rows, const u8* w,
                                            u64 n, u64 k) {
    unsigned l = threadIdx.x & 31, warp = threadIdx.x / 32;
    u64 j0 = ((u64)blockIdx.x * F16W_WARPS + warp) * O;
    const uint4* wr[O];
#pragma unroll
    for (int o = 0; o < O; o++) {
        // An output past n reads row n − 1 and writes nothing.
        u64 j = j0 + o < n ? j0 + o : n - 1;
        wr[o] = (const uint4*)(w + j * 2 * k);
    }
    for (u64 r0 = (u64)blockIdx.y * R; r0 < rows; r0 += (u64)gridDim.y * R) {
        u64 nr = st_min(R, rows - r0);
        float acc[O][R];
#pragma unroll
        for (int o = 0; o < O; o++)
#pragma unroll
            for (int t = 0; t < R; t++) acc[o][t] = 0.0f;
        f16w_chains<W, O, R, AHEAD>(acc, wr, x + r0 * k, k, nr, l);
#pragma unroll
        for (int o = 0; o < O; o++)
#pragma unroll
            for (int t = 0; t < R; t++) {
                float s = warp_sum(acc[o][t]);
                if (l == 0 && (u64)t < nr && j0 + o < n) y[(r0 + t) * n + j0 + o] = s;
            }
    }
}

// One activation row (a decode step): a warp an output, eight words a lane
// in flight. `__launch_bounds__(256, 1)` (256 = F16W_WARPS · 32, the only
// block `stored.rs` launches): without it ptxas keeps the kernel at 38
// registers by issuing each weight word just before its unit's FMAs, so a
// lane waited on memory once a unit rather than once a round of eight
// (the SASS read here: at most 4 loads in a row; with the bound 115
// registers and all 24 of a round's loads first). A decode row's products
// are small grids (8–128 blocks), latency-bound rather than short of
// warps: run 47 had them at ~8 µs a launch from 0.5 MB to 17 MB. The
// bound changes registers and schedule only, not an operation: same bits.
extern "C" __global__ void __launch_bounds__(256, 1) f16w_one_f16(float* y, const float* x, u64 rows, const u8* w, u64 n,
                                        u64 k) {
    dep_entry();
    f16w_matmul<F16wHalf, 1, 1, 8>(y, x, rows, w, n, k);
}
extern "C" __global__ void __launch_bounds__(256, 1) f16w_one_bf16(float* y, const float* x, u64 rows, const u8* w, u64 n,
                                         u64 k) {
    dep_entry();
    f16w_matmul<F16wBf16, 1, 1, 8>(y, x, rows, w, n, k);
}
// 2–64 rows (verify windows, small batches): a warp an output over tiles of
// 8 rows.
extern "C" __global__ void f16w_few_f16(float* y, const float* x, u64 rows, const u8* w, u64 n,
                                        u64 k) {
    dep_entry();
    f16w_matmul<F16wHalf, 1, 8, 2>(y, x, rows, w, n, k);
}
extern "C" __global__ void f16w_few_bf16(float* y, const float* x, u64 rows, const u8* w, u64 n,
                                         u64 k) {
    dep_entry();
    f16w_matmul<F16wBf16, 1, 8, 2>(y, x, rows, w, n, k);
}
// More rows (prefill): four outputs a warp over tiles of 8 rows, each weight
// word read once a tile for 32 sums.
extern "C" __global__ void f16w_rows_f16(float* y, const float* x, u64 rows, const u8* w, u64 n,
                                         u64 k) {
    dep_entry();
    f16w_matmul<F16wHalf, 4, 8, 1>(y, x, rows, w, n, k);
}
extern "C" __global__ void f16w_rows_bf16(float* y, const float* x, u64 rows, const u8* w, u64 n,
                                          u64 k) {
    dep_entry();
    f16w_matmul<F16wBf16, 4, 8, 1>(y, x, rows, w, n, k);
}

// Routed products: y[p, j] = x[p / x_div] · w[experts[p]·n + j] for pairs
// along grid.y, a warp an output: each sum `f16w_matmul`'s, so a routed
// projection has the bits of a product by that expert's matrix.
// Launch-bounded as `f16w_one_*`, for the same reason.
template <class W>
__device__ __forceinline__ void f16w_gather(float* y, const float* x, u64 x_div,
                                            const u32* experts, u64 pairs, const u8* w, u64 n,
                                            u64 k) {
    unsigned l = threadIdx.x & 31, warp = threadIdx.x / 32;
    u64 j = (u64)blockIdx.x * F16W_WARPS + warp;
    if (j >= n) return;
    for (u64 p = blockIdx.y; p < pairs; p += gridDim.y) {
        const uint4* wr[1] = {(const uint4*)(w + ((u64)experts[p] * n + j) * 2 * k)};
        float acc[1][1] = {{0.0f}};
        f16w_chains<W, 1, 1, 8>(acc, wr, x + (p / x_div) * k, k, 1, l);
        float s = warp_sum(acc[0][0]);
        if (l == 0) y[p * n + j] = s;
    }
}
extern "C" __global__ void __launch_bounds__(256, 1) f16w_gather_f16(float* y, const float* x, u64 x_div,
                                           const u32* experts, u64 pairs, const u8* w, u64 n,
                                           u64 k) {
    dep_entry();
    f16w_gather<F16wHalf>(y, x, x_div, experts, pairs, w, n, k);
}
extern "C" __global__ void __launch_bounds__(256, 1) f16w_gather_bf16(float* y, const float* x, u64 x_div,
                                            const u32* experts, u64 pairs, const u8* w, u64 n,
                                            u64 k) {
    dep_entry();
    f16w_gather<F16wBf16>(y, x, x_div, experts, pairs, w, n, k);
}
