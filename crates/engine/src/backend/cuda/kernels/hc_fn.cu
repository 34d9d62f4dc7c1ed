// The fast kernel set's mHC `fn` projection (`Backend::rms_matmul`,
// `cuda/hc_fn.rs`): y[r, j] = Σ_i w[j, i] · (x[r, i] / m_r) with
// m_r = sqrt(Σ_i x[r, i]² / k + eps), the RMS norm without a weight and the
// product in one launch.
//
// Why: DeepSeek-V4's and GLM-5's streams are 4 × hidden wide (16,384) and
// the projection has 24 outputs; the reference set's product keeps the
// CPU's order (8 lanes a weight row, each walking k / 8 values in turn) on
// 6 blocks and took 31.5 µs a launch for 786 KB, with the wide norm before
// it another 8.6 µs (run 37's decode step: 3.1 ms of 15.8 for the 64
// launches of each). Here a block of 256 threads owns one row and `OUTS`
// outputs, so a decode row's 24 outputs take 24 blocks.
//
// The order (the fast set's own, rule 6 of `shared/specs/backend.md`): both
// sums walk 8-value units, thread t the units u ≡ t (mod 256) in order and
// a unit's values in order (fmaf), then `warp_sum`'s fixed butterfly, then
// the 8 warps' sums added in warp order. It depends on k alone: never on
// the row count, the grid or `OUTS` (each output's sum is the same
// sequence whichever block computes it), so a row's outputs have the same
// bits in a decode step, a verify window and a prefill chunk. k must be a
// multiple of 8 (`hc_fn.rs` runs the reference's two ops otherwise, for
// every row count alike).

#define HC_FN_THREADS 256
#define HC_FN_WARPS (HC_FN_THREADS / 32)

// The 8 weights of unit `u` of weight row `row` (k values a row).
// `Raw` is a unit as loaded (`load`), `unpack` its 8 values: the one-output
// kernel loads its first round's weights before the norm's sum.
struct HcF32 {
    // 16 registers a unit: loaded early, a round spills (ptxas: 212 bytes).
    enum { EARLY = 0 };
    struct Raw {
        float4 a, b;
    };
    static __device__ __forceinline__ Raw load(const void* w, u64 row, u64 k, u64 u) {
        const float4* p = (const float4*)((const float*)w + row * k + u * 8);
        return Raw{p[0], p[1]};
    }
    static __device__ __forceinline__ void unpack(const Raw& r, float (&v)[8]) {
        v[0] = r.a.x; v[1] = r.a.y; v[2] = r.a.z; v[3] = r.a.w;
        v[4] = r.b.x; v[5] = r.b.y; v[6] = r.b.z; v[7] = r.b.w;
    }
    static __device__ __forceinline__ void unit(const void* w, u64 row, u64 k, u64 u,
                                                float (&v)[8]) {
        unpack(load(w, row, k, u), v);
    }
};
struct HcF16 {
    enum { EARLY = 1 };
    typedef uint4 Raw;
    static __device__ __forceinline__ Raw load(const void* w, u64 row, u64 k, u64 u) {
        return *(const uint4*)((const u16*)w + row * k + u * 8);
    }
    static __device__ __forceinline__ void unpack(const Raw& r, float (&v)[8]) {
        F16wHalf::unpack(r, v);
    }
    static __device__ __forceinline__ void unit(const void* w, u64 row, u64 k, u64 u,
                                                float (&v)[8]) {
        unpack(load(w, row, k, u), v);
    }
};
struct HcBF16 {
    enum { EARLY = 1 };
    typedef uint4 Raw;
    static __device__ __forceinline__ Raw load(const void* w, u64 row, u64 k, u64 u) {
        return *(const uint4*)((const u16*)w + row * k + u * 8);
    }
    static __device__ __forceinline__ void unpack(const Raw& r, float (&v)[8]) {
        F16wBf16::unpack(r, v);
    }
    static __device__ __forceinline__ void unit(const void* w, u64 row, u64 k, u64 u,
                                                float (&v)[8]) {
        unpack(load(w, row, k, u), v);
    }
};

// The block's sum of each thread's `a[o]` (o < N): butterfly per warp,
// then warps in order; every thread gets the sums. `part` holds N × 8.
template <int N>
__device__ __forceinline__ void hc_fn_block_sum(float (&a)[N], float* part) {
    unsigned lane = threadIdx.x & 31, warp = threadIdx.x / 32;
#pragma unroll
    for (int o = 0; o < N; o++) {
        float s = warp_sum(a[o]);
        if (lane == 0) part[o * HC_FN_WARPS + warp] = s;
    }
    __syncthreads();
#pragma unroll
    for (int o = 0; o < N; o++) {
        float s = 0.0f;
#pragma unroll
        for (int q = 0; q < HC_FN_WARPS; q++) s += part[o * HC_FN_WARPS + q];
        a[o] = s;
    }
    __syncthreads();
}

// The 8 values of unit `u` of row `xr` (two float4 loads where the row
// is 16-byte aligned).
__device__ __forceinline__ void hc_x_unit(const float* xr, u64 u, float (&v)[8]) {
    const float* p = xr + u * 8;
    if (((u64)p & 15) == 0) {
        float4 a = ((const float4*)p)[0], b = ((const float4*)p)[1];
        v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w;
        v[4] = b.x; v[5] = b.y; v[6] = b.z; v[7] = b.w;
    } else {
#pragma unroll
        for (int c = 0; c < 8; c++) v[c] = p[c];
    }
}

// Units of a thread loaded before their sums (one-output blocks: a decode
// row's 24 blocks each walk a 16,384-value row; with each unit's loads
// waiting on the last unit's sums, the launch took 12.4 µs for 786 KB;
// run 43: DeepSeek-V4's 32-layer step 12.56 -> 12.36 ms, same digest).
#define HC_FN_AHEAD 8

// Grid: x over groups of `OUTS` outputs, y over rows (both loop).
template <class W, int OUTS>
__device__ __forceinline__ void hc_fn(float* y, const float* x, u64 rows, const void* w, u64 n,
                                      u64 k, float eps) {
    __shared__ float part[OUTS * HC_FN_WARPS];
    constexpr int AHEAD = OUTS == 1 ? HC_FN_AHEAD : 1;
    u64 units = k / 8;
    for (u64 r = blockIdx.y; r < rows; r += gridDim.y) {
        const float* xr = x + r * k;
        // One output of 16-bit weights: the first round of this block's
        // first output's weights loaded now, so their memory latency passes under the
        // norm's sum and its block reduction (a decode row's 24 blocks each
        // walk a 16,384-value row in one round: the weights were waited for
        // only after the reduction). The same values reach the same
        // products: same bits.
        typename W::Raw first[AHEAD];
        u64 j_first = (u64)blockIdx.x * OUTS;
        constexpr bool early = OUTS == 1 && W::EARLY;
        if (early && j_first < n) {
#pragma unroll
            for (int a = 0; a < AHEAD; a++) {
                u64 u = threadIdx.x + (u64)a * HC_FN_THREADS;
                if (u < units) first[a] = W::load(w, j_first, k, u);
            }
        }
        float ss[1] = {0.0f};
        for (u64 u0 = threadIdx.x; u0 < units; u0 += HC_FN_THREADS * AHEAD) {
            float xv[AHEAD][8];
#pragma unroll
            for (int a = 0; a < AHEAD; a++) {
                u64 u = u0 + (u64)a * HC_FN_THREADS;
                if (u < units) hc_x_unit(xr, u, xv[a]);
            }
#pragma unroll
            for (int a = 0; a < AHEAD; a++) {
                if (u0 + (u64)a * HC_FN_THREADS < units) {
#pragma unroll
                    for (int c = 0; c < 8; c++) ss[0] = fmaf(xv[a][c], xv[a][c], ss[0]);
                }
            }
        }
        hc_fn_block_sum<1>(ss, part);
        float m = sqrtf(ss[0] / (float)k + eps);
        for (u64 j0 = (u64)blockIdx.x * OUTS; j0 < n; j0 += (u64)gridDim.x * OUTS) {
            float acc[OUTS];
#pragma unroll
            for (int o = 0; o < OUTS; o++) acc[o] = 0.0f;
            if (OUTS == 1) {
                // One output: AHEAD units' weights and values loaded before
                // the first of their products (the same products in the
                // same order).
                for (u64 u0 = threadIdx.x; u0 < units; u0 += HC_FN_THREADS * AHEAD) {
                    float wv[AHEAD][8], xv[AHEAD][8];
                    bool loaded = early && j0 == j_first && u0 == threadIdx.x;
#pragma unroll
                    for (int a = 0; a < AHEAD; a++) {
                        u64 u = u0 + (u64)a * HC_FN_THREADS;
                        if (u < units) {
                            if (loaded) W::unpack(first[a], wv[a]);
                            else W::unit(w, j0, k, u, wv[a]);
                            hc_x_unit(xr, u, xv[a]);
                        }
                    }
#pragma unroll
                    for (int a = 0; a < AHEAD; a++) {
                        if (u0 + (u64)a * HC_FN_THREADS < units && j0 < n) {
#pragma unroll
                            for (int c = 0; c < 8; c++) acc[0] = fmaf(wv[a][c], xv[a][c] / m, acc[0]);
                        }
                    }
                }
            } else {
                for (u64 u = threadIdx.x; u < units; u += HC_FN_THREADS) {
                    float f[8];
#pragma unroll
                    for (int c = 0; c < 8; c++) f[c] = xr[u * 8 + c] / m;
#pragma unroll
                    for (int o = 0; o < OUTS; o++) {
                        if (j0 + o < n) {
                            float v[8];
                            W::unit(w, j0 + o, k, u, v);
#pragma unroll
                            for (int c = 0; c < 8; c++) acc[o] = fmaf(v[c], f[c], acc[o]);
                        }
                    }
                }
            }
            hc_fn_block_sum<OUTS>(acc, part);
            if (threadIdx.x < OUTS && j0 + threadIdx.x < n) {
                // Read the sum of output `threadIdx.x` without a dynamic
                // register index.
                float s = acc[0];
#pragma unroll
                for (int o = 1; o < OUTS; o++)
                    if (threadIdx.x == (unsigned)o) s = acc[o];
                y[r * n + j0 + threadIdx.x] = s;
            }
        }
    }
}

// One output a block (decode rows, verify windows: every SM a block) and 8
// a block (prefill chunks: each row's values read once for 8 outputs).
extern "C" __global__ void hc_fn_f32_o1(float* y, const float* x, u64 rows, const float* w, u64 n,
                                        u64 k, float eps) {
    dep_entry();
    hc_fn<HcF32, 1>(y, x, rows, w, n, k, eps);
}
extern "C" __global__ void hc_fn_f32_o8(float* y, const float* x, u64 rows, const float* w, u64 n,
                                        u64 k, float eps) {
    dep_entry();
    hc_fn<HcF32, 8>(y, x, rows, w, n, k, eps);
}
extern "C" __global__ void hc_fn_f16_o1(float* y, const float* x, u64 rows, const u8* w, u64 n,
                                        u64 k, float eps) {
    dep_entry();
    hc_fn<HcF16, 1>(y, x, rows, w, n, k, eps);
}
extern "C" __global__ void hc_fn_f16_o8(float* y, const float* x, u64 rows, const u8* w, u64 n,
                                        u64 k, float eps) {
    dep_entry();
    hc_fn<HcF16, 8>(y, x, rows, w, n, k, eps);
}
extern "C" __global__ void hc_fn_bf16_o1(float* y, const float* x, u64 rows, const u8* w, u64 n,
                                         u64 k, float eps) {
    dep_entry();
    hc_fn<HcBF16, 1>(y, x, rows, w, n, k, eps);
}
extern "C" __global__ void hc_fn_bf16_o8(float* y, const float* x, u64 rows, const u8* w, u64 n,
                                         u64 k, float eps) {
    dep_entry();
    hc_fn<HcBF16, 8>(y, x, rows, w, n, k, eps);
}
