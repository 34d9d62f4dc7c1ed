// Norms (one warp per normalised slice) and RoPE. A slice's sum of squares
// is the GPU's own fixed order: lane l adds v·v for the indices ≡ l (mod 32)
// in order, then the warp butterfly (`warp_sum`); it depends on the slice
// width only. The formulas around the sum are the CPU reference's.

#define FOR_EACH_WARP(s, n)                                                          \
    for (u64 s = (u64)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32; s < (u64)(n); \
         s += (u64)gridDim.x * (blockDim.x / 32))

// Values a lane loads before it adds them (the same additions in the same
// order: only the loads move ahead). One warp walks a slice alone, so a
// loop that waits for each load before the next was latency-bound: run 30's
// decode-step profile (DeepSeek-V4, `docs/GPU.md`) had `rms_norm_f32` at
// 95 µs a launch, a quarter of the step.
#define NORM_BATCH 16

__device__ __forceinline__ float slice_sumsq(const float* x, u64 n) {
    unsigned lane = threadIdx.x & 31;
    float a = 0.0f;
    u64 i = lane;
    for (; i + 32 * (NORM_BATCH - 1) < n; i += 32 * NORM_BATCH) {
        float v[NORM_BATCH];
#pragma unroll
        for (int j = 0; j < NORM_BATCH; j++) v[j] = x[i + 32 * j];
#pragma unroll
        for (int j = 0; j < NORM_BATCH; j++) a += v[j] * v[j];
    }
    for (; i < n; i += 32) a += x[i] * x[i];
    return warp_sum(a);
}

// Llama RMSNorm (candle's formula): x / sqrt(Σx²/n + eps) · w.
extern "C" __global__ void rms_norm_f32(float* y, const float* x, const float* w, u64 rows,
                                        u64 width, float eps) {
    dep_entry();
    unsigned lane = threadIdx.x & 31;
    FOR_EACH_WARP(r, rows) {
        const float* xr = x + r * width;
        float m = sqrtf(slice_sumsq(xr, width) / (float)width + eps);
        u64 i = lane;
        for (; i + 32 * (NORM_BATCH - 1) < width; i += 32 * NORM_BATCH) {
            float xv[NORM_BATCH], wv[NORM_BATCH];
#pragma unroll
            for (int j = 0; j < NORM_BATCH; j++) {
                xv[j] = xr[i + 32 * j];
                wv[j] = w[i + 32 * j];
            }
#pragma unroll
            for (int j = 0; j < NORM_BATCH; j++) y[r * width + i + 32 * j] = xv[j] / m * wv[j];
        }
        for (; i < width; i += 32) y[r * width + i] = xr[i] / m * w[i];
    }
}

// `rms_norm_f32` for few wide rows (a block per row): the block's threads
// copy the row into shared memory a piece at a time (cp.async, the next
// piece in flight while the current one is summed), warp 0 adds each lane's
// values exactly as `slice_sumsq` does (lane l: indices ≡ l mod 32 in
// order, then `warp_sum`), and every thread writes outputs. Same bits as
// `rms_norm_f32`; run 31's DeepSeek-V4 step had the hyper-connection norms
// (one row of 16384) at 17 µs a launch with one warp a row, waiting on its
// loads.
#define WIDE_PIECE 4096
__device__ __forceinline__ void norm_cp4(float* smem, const float* gmem) {
    u32 s = (u32)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(s), "l"(gmem) : "memory");
}
__device__ __forceinline__ void norm_piece(float* buf, const float* xr, u64 p0, u64 width) {
    u64 m = width - p0 < WIDE_PIECE ? width - p0 : WIDE_PIECE;
    for (u64 i = threadIdx.x; i < m; i += blockDim.x) norm_cp4(buf + i, xr + p0 + i);
    asm volatile("cp.async.commit_group;" ::: "memory");
}
extern "C" __global__ void rms_norm_wide_f32(float* y, const float* x, const float* w, u64 rows,
                                             u64 width, float eps) {
    dep_entry();
    __shared__ float buf[2][WIDE_PIECE];
    __shared__ float total;
    unsigned lane = threadIdx.x & 31, warp = threadIdx.x / 32;
    u64 pieces = (width + WIDE_PIECE - 1) / WIDE_PIECE;
    for (u64 r = blockIdx.x; r < rows; r += gridDim.x) {
        const float* xr = x + r * width;
        float a = 0.0f;
        norm_piece(buf[0], xr, 0, width);
        for (u64 p = 0; p < pieces; p++) {
            if (p + 1 < pieces) {
                norm_piece(buf[(p + 1) & 1], xr, (p + 1) * WIDE_PIECE, width);
                asm volatile("cp.async.wait_group 1;" ::: "memory");
            } else {
                asm volatile("cp.async.wait_group 0;" ::: "memory");
            }
            __syncthreads();
            if (warp == 0) {
                // WIDE_PIECE is a multiple of 32: lane l's values of this
                // piece are the next ones of its sequence.
                u64 p0 = p * WIDE_PIECE, m = width - p0 < WIDE_PIECE ? width - p0 : WIDE_PIECE;
                const float* b = buf[p & 1];
                // NORM_BATCH loads before their additions (run 31: one
                // shared load a step left the chain at 28 µs a row).
                u64 i = lane;
                for (; i + 32 * (NORM_BATCH - 1) < m; i += 32 * NORM_BATCH) {
                    float v[NORM_BATCH];
#pragma unroll
                    for (int j = 0; j < NORM_BATCH; j++) v[j] = b[i + 32 * j];
#pragma unroll
                    for (int j = 0; j < NORM_BATCH; j++) a += v[j] * v[j];
                }
                for (; i < m; i += 32) a += b[i] * b[i];
            }
            __syncthreads();
        }
        if (warp == 0) {
            a = warp_sum(a);
            if (lane == 0) total = a;
        }
        __syncthreads();
        float m = sqrtf(total / (float)width + eps);
        // NORM_BATCH loads of x and w before their stores: `y` may alias
        // `x` as far as the compiler knows, so a loop storing each output
        // before the next load waited on memory once per value (run 32's
        // profile: 27.7 µs a launch for one row of 16384, most of it here).
        u64 bd = blockDim.x, i = threadIdx.x;
        for (; i + bd * (NORM_BATCH - 1) < width; i += bd * NORM_BATCH) {
            float xv[NORM_BATCH], wv[NORM_BATCH];
#pragma unroll
            for (int j = 0; j < NORM_BATCH; j++) {
                xv[j] = xr[i + bd * j];
                wv[j] = w[i + bd * j];
            }
#pragma unroll
            for (int j = 0; j < NORM_BATCH; j++) y[r * width + i + bd * j] = xv[j] / m * wv[j];
        }
        for (; i < width; i += bd) y[r * width + i] = xr[i] / m * w[i];
        __syncthreads();
    }
}

// Zero-centred grouped RMSNorm (candle's ops): mean = Σx²·(1/g) + 0,
// inv = 1/sqrt(mean·1 + eps), out = (x·inv)·scale. One block of
// GROUPED_THREADS (256) per slice, since a slice is a whole hyper-connection
// stream row (4 × 2560 values) and one warp walked it alone: thread t adds
// x·x over the indices ≡ t (mod 256) in order, each warp's butterfly, then
// the eight warp sums in warp order from +0. The order depends on the slice
// width only (the launch always uses 256 threads).
#define GROUPED_THREADS 256
// Values per thread kept in registers (slices up to 4096 values): all of a
// thread's loads and its scales are in flight at once, instead of one load
// per step of the sum and again for the output (a decode step runs this on
// four slices: latency, not bandwidth). The same sums in the same order.
#define GROUPED_REG 16
// The slices' norm; with INJECT, the value at index i of slice s (row t =
// s / c, stream s mod c) is first `inject_streams_f32`'s `x + inj[s]·yv[t,
// i]` (one rounding each, no contraction: NVRTC runs with --fmad=false),
// stored to `xout`, so the fused launch has the bits of the two.
template <int INJECT>
__device__ __forceinline__ void grouped_norm(float* y, float* xout, const float* x,
                                             const float* yv, const float* inj, u64 c,
                                             const float* scale, u64 slices, u64 width,
                                             u64 group, float inv_n, float eps) {
    __shared__ float part[GROUPED_THREADS / 32];
    unsigned tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    bool in_regs = group <= (u64)GROUPED_THREADS * GROUPED_REG;
    for (u64 s = blockIdx.x; s < slices; s += gridDim.x) {
        const float* xs = x + s * group;
        const float* ys = INJECT ? yv + (s / c) * group : nullptr;
        float g = INJECT ? inj[s] : 0.0f;
        // What the sums and outputs read: the input, or the injected values
        // this thread stored.
        const float* src = INJECT ? xout + s * group : xs;
        u64 c0 = (s * group) % width;
        float v[GROUPED_REG], sc[GROUPED_REG];
        float a = 0.0f;
        if (in_regs) {
            // Every load before any store: a store to `xout` may alias
            // the inputs, so loads after it would wait for it.
            float yy[GROUPED_REG];
#pragma unroll
            for (int j = 0; j < GROUPED_REG; j++) {
                u64 i = tid + (u64)j * GROUPED_THREADS;
                v[j] = i < group ? xs[i] : 0.0f;
                if (INJECT) yy[j] = i < group ? ys[i] : 0.0f;
                sc[j] = i < group ? scale[c0 + i] : 0.0f;
            }
            if (INJECT) {
#pragma unroll
                for (int j = 0; j < GROUPED_REG; j++) {
                    u64 i = tid + (u64)j * GROUPED_THREADS;
                    if (i < group) {
                        v[j] = v[j] + g * yy[j];
                        xout[s * group + i] = v[j];
                    }
                }
            }
#pragma unroll
            for (int j = 0; j < GROUPED_REG; j++)
                if (tid + (u64)j * GROUPED_THREADS < group) a += v[j] * v[j];
        } else {
            for (u64 i = tid; i < group; i += GROUPED_THREADS) {
                float vi = xs[i];
                if (INJECT) {
                    vi = vi + g * ys[i];
                    xout[s * group + i] = vi;
                }
                a += vi * vi;
            }
        }
        a = warp_sum(a);
        if (lane == 0) part[warp] = a;
        __syncthreads();
        float sum = 0.0f;
        for (int w = 0; w < GROUPED_THREADS / 32; w++) sum += part[w];
        float mean = sum * inv_n + 0.0f;
        float inv = 1.0f / sqrtf(mean * 1.0f + eps);
        if (in_regs) {
#pragma unroll
            for (int j = 0; j < GROUPED_REG; j++) {
                u64 i = tid + (u64)j * GROUPED_THREADS;
                if (i < group) y[s * group + i] = (v[j] * inv) * sc[j];
            }
        } else {
            for (u64 i = tid; i < group; i += GROUPED_THREADS)
                y[s * group + i] = (src[i] * inv) * scale[c0 + i];
        }
        // `part` is rewritten by the next slice.
        __syncthreads();
    }
}

extern "C" __global__ void rms_norm_grouped_f32(float* y, const float* x, const float* scale,
                                                u64 slices, u64 width, u64 group, float inv_n,
                                                float eps) {
    dep_entry();
    grouped_norm<0>(y, nullptr, x, nullptr, nullptr, 1, scale, slices, width, group, inv_n, eps);
}

// `inject_streams_f32` then `rms_norm_grouped_f32` of its output in one
// launch (`Backend::inject_streams_norm`: a hyper-connection's write-back
// and the next mix's norm, 2.7 + 3.1 µs as two launches of a decode step):
// xout = xs + inj ⊗ yv, y = the norm of xout, `width` = c·group.
extern "C" __global__ void inject_norm_grouped_f32(float* y, float* xout, const float* xs,
                                                   const float* yv, const float* inj, u64 c,
                                                   const float* scale, u64 slices, u64 width,
                                                   u64 group, float inv_n, float eps) {
    dep_entry();
    grouped_norm<1>(y, xout, xs, yv, inj, c, scale, slices, width, group, inv_n, eps);
}

// In place per dim-slice: x·(1/sqrt(Σx²/dim + eps))·scale.
extern "C" __global__ void rms_norm_heads_f32(float* x, const float* scale, u64 slices, u64 dim,
                                              float eps) {
    dep_entry();
    unsigned lane = threadIdx.x & 31;
    FOR_EACH_WARP(s, slices) {
        float* xs = x + s * dim;
        float inv = 1.0f / sqrtf(slice_sumsq(xs, dim) / (float)dim + eps);
        __syncwarp();
        // NORM_BATCH loads before their stores (in place, so the compiler
        // kept each load after the last store: a 512-value head waited on
        // memory 16 times, 8.3 µs a launch in run 47's profile).
        u64 i = lane;
        for (; i + 32 * (NORM_BATCH - 1) < dim; i += 32 * NORM_BATCH) {
            float xv[NORM_BATCH], sv[NORM_BATCH];
#pragma unroll
            for (int j = 0; j < NORM_BATCH; j++) {
                xv[j] = xs[i + 32 * j];
                sv[j] = scale[i + 32 * j];
            }
#pragma unroll
            for (int j = 0; j < NORM_BATCH; j++) xs[i + 32 * j] = xv[j] * inv * sv[j];
        }
        for (; i < dim; i += 32) xs[i] = xs[i] * inv * scale[i];
    }
}

// In place per dim-slice: x·(1/sqrt(Σx² + 1e-6)·scale).
extern "C" __global__ void l2_norm_heads_f32(float* x, u64 slices, u64 dim, float scale) {
    dep_entry();
    unsigned lane = threadIdx.x & 31;
    FOR_EACH_WARP(s, slices) {
        float* xs = x + s * dim;
        float inv = 1.0f / sqrtf(slice_sumsq(xs, dim) + 1e-6f);
        __syncwarp();
        // NORM_BATCH loads before their stores, as `rms_norm_heads_f32`.
        float f = inv * scale;
        u64 i = lane;
        for (; i + 32 * (NORM_BATCH - 1) < dim; i += 32 * NORM_BATCH) {
            float xv[NORM_BATCH];
#pragma unroll
            for (int j = 0; j < NORM_BATCH; j++) xv[j] = xs[i + 32 * j];
#pragma unroll
            for (int j = 0; j < NORM_BATCH; j++) xs[i + 32 * j] = xv[j] * f;
        }
        for (; i < dim; i += 32) xs[i] *= f;
    }
}

// w·(o·1/sqrt(Σo²/dim + eps))·act(z), act = σ (silu = 0) or z·σ(z).
extern "C" __global__ void gated_rms_norm_f32(float* y, const float* o, const float* z,
                                              const float* w, u64 slices, u64 dim, float eps,
                                              int silu) {
    dep_entry();
    unsigned lane = threadIdx.x & 31;
    FOR_EACH_WARP(s, slices) {
        const float* os = o + s * dim;
        float inv = 1.0f / sqrtf(slice_sumsq(os, dim) / (float)dim + eps);
        for (u64 i = lane; i < dim; i += 32) {
            float zv = z[s * dim + i];
            float g = silu ? zv * sigmoid_f(zv) : sigmoid_f(zv);
            y[s * dim + i] = w[i] * (os[i] * inv) * g;
        }
    }
}

// RoPE in place: row r of x [rows, heads·head_dim] by cos/sin[r·half ..].
// layout 0: half split (i, i+half); 1: interleaved (2i, 2i+1); 2:
// interleaved over the head's trailing 2·half dims.
extern "C" __global__ void rope_f32(float* x, const float* cs, const float* sn, u64 rows,
                                    u64 heads, u64 head_dim, u64 half, int layout) {
    dep_entry();
    FOR_EACH(t, rows * heads * half) {
        u64 r = t / (heads * half), h = (t / half) % heads, i = t % half;
        float* hd = x + (r * heads + h) * head_dim;
        float c = cs[r * half + i], s = sn[r * half + i];
        if (layout == 0) {
            float a = hd[i], b = hd[i + half];
            hd[i] = a * c - b * s;
            hd[i + half] = b * c + a * s;
        } else {
            float* p = layout == 1 ? hd : hd + head_dim - 2 * half;
            float a = p[2 * i], b = p[2 * i + 1];
            p[2 * i] = a * c - b * s;
            p[2 * i + 1] = a * s + b * c;
        }
    }
}

// LayerNorm with a bias (GLM-5's indexer keys), one warp per row: mean and
// biased variance by the warp order above, then (x − mean)·inv·w + b.
extern "C" __global__ void layer_norm_f32(float* y, const float* x, const float* w,
                                          const float* b, u64 rows, u64 width, float eps) {
    dep_entry();
    unsigned lane = threadIdx.x & 31;
    FOR_EACH_WARP(r, rows) {
        const float* xr = x + r * width;
        float s = 0.0f;
        for (u64 i = lane; i < width; i += 32) s += xr[i];
        float mean = warp_sum(s) / (float)width;
        float v = 0.0f;
        for (u64 i = lane; i < width; i += 32) v += (xr[i] - mean) * (xr[i] - mean);
        float inv = 1.0f / sqrtf(warp_sum(v) / (float)width + eps);
        for (u64 i = lane; i < width; i += 32) y[r * width + i] = (xr[i] - mean) * inv * w[i] + b[i];
    }
}
