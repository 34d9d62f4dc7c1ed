// mHC hyper-connections: Sinkhorn mixing weights (one thread per row, N is
// 4), the block input and the write-back, each element in the CPU
// reference's order (`cpu::hyper`).

// One row of `[pre | post | C]` from z. `N` > 0: the stream count known at
// compile time, C kept in registers (run 30's DeepSeek-V4 profile: walking
// C in global memory, each of the ~1,300 dependent loads and stores of 20
// rounds waiting on the cache, took 59 µs a launch); `N` = 0: any n, C in
// `out`. The same operations in the same order either way.
template <int N>
__device__ __forceinline__ void hc_sinkhorn_row(float* o, const float* zr, const float* base,
                                                const float* scale, int n_rt, int iters,
                                                float eps) {
    const int n = N > 0 ? N : n_rt;
    float creg[N > 0 ? N * N : 1];
    float* c = N > 0 ? creg : o + 2 * n;
#pragma unroll
    for (int i = 0; i < n; i++) {
        o[i] = 1.0f / (1.0f + expf(-(zr[i] * scale[0] + base[i]))) + eps;
        o[n + i] = 2.0f * (1.0f / (1.0f + expf(-(zr[n + i] * scale[1] + base[n + i]))));
    }
#pragma unroll
    for (int j = 0; j < n; j++) {
        float* row = c + j * n;
#pragma unroll
        for (int k = 0; k < n; k++) row[k] = zr[2 * n + j * n + k] * scale[2] + base[2 * n + j * n + k];
        float mx = DS4_NEG_INF;
#pragma unroll
        for (int k = 0; k < n; k++) mx = fmaxf(mx, row[k]);
        float sum = 0.0f;
#pragma unroll
        for (int k = 0; k < n; k++) {
            row[k] = expf(row[k] - mx);
            sum += row[k];
        }
#pragma unroll
        for (int k = 0; k < n; k++) row[k] = row[k] / sum + eps;
    }
    // Columns once, then `iters − 1` rounds of rows and columns.
    for (int it = 0; it < (iters > 1 ? iters : 1); it++) {
        if (it > 0) {
#pragma unroll
            for (int j = 0; j < n; j++) {
                float s = 0.0f;
#pragma unroll
                for (int k = 0; k < n; k++) s += c[j * n + k];
#pragma unroll
                for (int k = 0; k < n; k++) c[j * n + k] /= s + eps;
            }
        }
#pragma unroll
        for (int k = 0; k < n; k++) {
            float s = 0.0f;
#pragma unroll
            for (int j = 0; j < n; j++) s += c[j * n + k];
#pragma unroll
            for (int j = 0; j < n; j++) c[j * n + k] /= s + eps;
        }
    }
    if (N > 0) {
#pragma unroll
        for (int i = 0; i < n * n; i++) o[2 * n + i] = c[i];
    }
}

extern "C" __global__ void hc_sinkhorn_f32(float* out, const float* z, const float* base,
                                           const float* scale, u64 rows, int n, int iters,
                                           float eps) {
    dep_entry();
    FOR_EACH(r, rows) {
        int w = (2 + n) * n;
        if (n == 4)
            hc_sinkhorn_row<4>(out + r * w, z + r * w, base, scale, n, iters, eps);
        else
            hc_sinkhorn_row<0>(out + r * w, z + r * w, base, scale, n, iters, eps);
    }
}

// `hc_sinkhorn_f32` for N = 4 with a warp per row: lane t < 16 holds
// C[t / 4, t % 4], lanes 0–3 compute `pre`, 4–7 `post`. Every row or column
// sum is read through shuffles and added in the CPU's order by each lane
// that needs it, and each element is divided by its own lane, so the bits
// are `hc_sinkhorn_row`'s; run 31 had the one-thread form at 25 µs a launch
// (20 rounds of 16 dependent divisions), a DeepSeek-V4 step runs 2 a layer.
// `n_arg` is 4 (`hc_sinkhorn_f32`'s parameters, so one launch serves both).
extern "C" __global__ void hc_sinkhorn4_f32(float* out, const float* z, const float* base,
                                            const float* scale, u64 rows, int n_arg, int iters,
                                            float eps) {
    dep_entry();
    const int n = 4, w = (2 + n) * n;
    (void)n_arg;
    unsigned lane = threadIdx.x & 31;
    u64 warps = (u64)gridDim.x * (blockDim.x / 32);
    for (u64 r = (u64)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32; r < rows; r += warps) {
        const float* zr = z + r * w;
        float* o = out + r * w;
        int t = (int)(lane & 15), j = t / 4, k = t % 4;
        if (lane < 4)
            o[lane] = 1.0f / (1.0f + expf(-(zr[lane] * scale[0] + base[lane]))) + eps;
        else if (lane < 8)
            o[lane] = 2.0f * (1.0f / (1.0f + expf(-(zr[lane] * scale[1] + base[lane]))));
        float v = zr[2 * n + t] * scale[2] + base[2 * n + t];
        float mx = DS4_NEG_INF;
        for (int q = 0; q < n; q++) mx = fmaxf(mx, __shfl_sync(FULL_MASK, v, j * 4 + q));
        v = expf(v - mx);
        float sum = 0.0f;
        for (int q = 0; q < n; q++) sum += __shfl_sync(FULL_MASK, v, j * 4 + q);
        v = v / sum + eps;
        // Columns once, then `iters − 1` rounds of rows and columns.
        for (int it = 0; it < (iters > 1 ? iters : 1); it++) {
            if (it > 0) {
                float s = 0.0f;
                for (int q = 0; q < n; q++) s += __shfl_sync(FULL_MASK, v, j * 4 + q);
                v /= s + eps;
            }
            float s = 0.0f;
            for (int q = 0; q < n; q++) s += __shfl_sync(FULL_MASK, v, q * 4 + k);
            v /= s + eps;
        }
        if (lane < 16) o[2 * n + t] = v;
    }
}

// x[r, e] = Σ_s pre[r, s]·X[r, s, e], streams in order from 0.
extern "C" __global__ void hc_pre_f32(float* out, const float* xs, const float* mix, u64 rows,
                                      int n, u64 d) {
    dep_entry();
    int w = (2 + n) * n;
    FOR_EACH(i, rows * d) {
        u64 r = i / d, e = i % d;
        float acc = 0.0f;
        for (int s = 0; s < n; s++) acc += mix[r * w + s] * xs[(r * n + s) * d + e];
        out[i] = acc;
    }
}

// X'[r, k, e] = post[r, k]·y[r, e] + Σ_j C[r, j, k]·X[r, j, e].
extern "C" __global__ void hc_post_f32(float* out, const float* xs, const float* y,
                                       const float* mix, u64 rows, int n, u64 d) {
    dep_entry();
    int w = (2 + n) * n;
    FOR_EACH(i, rows * n * d) {
        u64 r = i / (n * d), k = (i / d) % n, e = i % d;
        const float* m = mix + r * w;
        float acc = 0.0f;
        for (int j = 0; j < n; j++) acc += m[2 * n + j * n + k] * xs[(r * n + j) * d + e];
        out[i] = m[n + k] * y[r * d + e] + acc;
    }
}
