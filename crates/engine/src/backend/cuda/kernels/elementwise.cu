// Element-wise ops and the small per-row maps of the op inventory. Each
// output element is computed alone, with the CPU reference's operations in
// its order (only `expf`/`log1pf` differ from the host's libm by an ulp or
// two).

extern "C" __global__ void add_f32(float* y, const float* a, const float* b, u64 n) {
    dep_entry();
    FOR_EACH(i, n) y[i] = a[i] + b[i];
}

extern "C" __global__ void mul_f32(float* y, const float* a, const float* b, u64 n) {
    dep_entry();
    FOR_EACH(i, n) y[i] = a[i] * b[i];
}

// `map` passes n last: y, x, b, width, n.
extern "C" __global__ void add_bias_f32(float* y, const float* x, const float* b, u64 width, u64 n) {
    dep_entry();
    FOR_EACH(i, n) y[i] = x[i] + b[i % width];
}

// 0.5·x·(1 + erf(x·(1/√2))), the CPU's order.
extern "C" __global__ void gelu_erf_f32(float* y, const float* x, u64 n) {
    dep_entry();
    FOR_EACH(i, n) y[i] = 0.5f * x[i] * (1.0f + erff(x[i] * 0.70710677f));
}

// 0.5·x·(1 + tanh(β·(x + κ·x³))), the CPU's order.
extern "C" __global__ void gelu_tanh_f32(float* y, const float* x, u64 n) {
    dep_entry();
    FOR_EACH(i, n) {
        float v = x[i];
        float inner = 0.7978846f * (v + 0.044715f * v * v * v);
        y[i] = 0.5f * v * (1.0f + tanhf(inner));
    }
}

extern "C" __global__ void affine_f32(float* y, const float* x, float mul, float add, u64 n) {
    dep_entry();
    FOR_EACH(i, n) y[i] = x[i] * mul + add;
}

extern "C" __global__ void silu_f32(float* y, const float* x, u64 n) {
    dep_entry();
    FOR_EACH(i, n) y[i] = x[i] / (1.0f + expf(-x[i]));
}

extern "C" __global__ void sigmoid_f32(float* y, const float* x, u64 n) {
    dep_entry();
    FOR_EACH(i, n) y[i] = 1.0f / (expf(-x[i]) + 1.0f);
}

// Up to four of affine (kind 0: `v·a + b`), silu (1) and sigmoid (2) in
// one pass, each written exactly as its own kernel above (--fmad=false, the
// same expf), so a chain has the bits of its steps launched one by one.
__device__ __forceinline__ float unary_step(float v, int kind, float a, float b) {
    if (kind == 0) return v * a + b;
    if (kind == 1) return v / (1.0f + expf(-v));
    return 1.0f / (expf(-v) + 1.0f);
}

// A chain of up to four steps as the kernels take it (`steps` = 0: none).
struct Chain {
    int steps;
    int k[4];
    float a[4], b[4];
    __device__ __forceinline__ float apply(float v) const {
#pragma unroll
        for (int t = 0; t < 4; t++)
            if (t < steps) v = unary_step(v, k[t], a[t], b[t]);
        return v;
    }
};

extern "C" __global__ void unary_chain_f32(float* y, const float* x, int steps, int k0, float a0,
                                           float b0, int k1, float a1, float b1, int k2, float a2,
                                           float b2, int k3, float a3, float b3, u64 n) {
    dep_entry();
    Chain c{steps, {k0, k1, k2, k3}, {a0, a1, a2, a3}, {b0, b1, b2, b3}};
    FOR_EACH(i, n) y[i] = c.apply(x[i]);
}

// `silu(g)·u`, or `silu(min(g, L))·clamp(u, −L, L)` when has_limit.
__device__ __forceinline__ float swiglu_one(float g, float u, int has_limit, float limit) {
    if (has_limit) {
        g = fminf(g, limit);
        u = u != u ? u : fminf(fmaxf(u, -limit), limit);
    }
    return g / (1.0f + expf(-g)) * u;
}

// gu: [rows, 2I] rows `[g | u]` → [rows, I].
extern "C" __global__ void swiglu_f32(float* y, const float* gu, u64 rows, u64 inter,
                                      int has_limit, float limit) {
    dep_entry();
    FOR_EACH(i, rows * inter) {
        u64 r = i / inter, c = i % inter;
        y[i] = swiglu_one(gu[r * 2 * inter + c], gu[r * 2 * inter + inter + c], has_limit, limit);
    }
}

// neg_a[h]·softplus(a + dt_bias[h]), softplus linear above 20 (also
// `delta_inputs_f32`'s decays).
__device__ __forceinline__ float softplus_decay_at(float a, const float* neg_a,
                                                   const float* dt_bias, u64 j) {
    float x = a + dt_bias[j];
    float sp = x > 20.0f ? x : log1pf(expf(x));
    return neg_a[j] * sp;
}

extern "C" __global__ void softplus_decay_f32(float* y, const float* a, const float* neg_a,
                                              const float* dt_bias, u64 n, u64 h) {
    dep_entry();
    FOR_EACH(i, n) y[i] = softplus_decay_at(a[i], neg_a, dt_bias, i % h);
}

extern "C" __global__ void scale_rows_f32(float* y, const float* x, const float* s, u64 n,
                                          u64 width) {
    dep_entry();
    FOR_EACH(i, n) y[i] = x[i] * s[i / width];
}

// base + x·sigmoid(g[row]): `sigmoid_f32`, `scale_rows_f32` and `add_f32`
// in one pass, each written as its own kernel (--fmad=false, the same
// expf), so the bits of the three launches.
extern "C" __global__ void add_gated_rows_f32(float* y, const float* base, const float* x,
                                              const float* g, u64 n, u64 width) {
    dep_entry();
    FOR_EACH(i, n) {
        float s = 1.0f / (expf(-g[i / width]) + 1.0f);
        float t = x[i] * s;
        y[i] = base[i] + t;
    }
}

// Products a PLE-gate warp stages per round (`ple_gate_f32`).
#define PLE_CHUNK 512

// Qwen's PLE gate, one warp per (token, stream): the sequential dot, the
// signed square root and σ; then the warp writes σ(g)·val over the
// stream's h values (one thread walking them alone was 140 µs of a decode
// step). The dot is `dot_seq`'s chain (-0, then each rounded product added
// in order) taken by lane 0 from products the warp computes PLE_CHUNK at a
// time into shared memory, the next chunk's loads in flight meanwhile:
// lane 0 loading the 2560 values of each side itself was 44 µs of a decode
// step (ncu, run 20).
extern "C" __global__ void ple_gate_f32(float* out, const float* key, const float* qry,
                                        const float* val, u64 tokens, u64 c, u64 h,
                                        float inv_sqrt_h) {
    dep_entry();
    __shared__ float prods[4][PLE_CHUNK];
    unsigned lane = threadIdx.x & 31;
    float* pw = prods[(threadIdx.x / 32) % 4];
    u64 warps = (u64)gridDim.x * (blockDim.x / 32);
    for (u64 i = (u64)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32; i < tokens * c;
         i += warps) {
        u64 t = i / c, s = i % c;
        u64 o = (t * c + s) * h;
        const int per = PLE_CHUNK / 32;
        float pr[per];
#pragma unroll
        for (int u = 0; u < per; u++) {
            u64 e = lane + 32 * (u64)u;
            pr[u] = e < h ? key[o + e] * qry[o + e] : 0.0f;
        }
        float g = -0.0f;
        for (u64 c0 = 0; c0 < h; c0 += PLE_CHUNK) {
#pragma unroll
            for (int u = 0; u < per; u++) pw[lane + 32 * u] = pr[u];
            __syncwarp();
            u64 next = c0 + PLE_CHUNK;
#pragma unroll
            for (int u = 0; u < per; u++) {
                u64 e = next + lane + 32 * (u64)u;
                pr[u] = e < h ? key[o + e] * qry[o + e] : 0.0f;
            }
            u64 n = h - c0 < PLE_CHUNK ? h - c0 : PLE_CHUNK;
            if (lane == 0) {
#pragma unroll 16
                for (u64 e = 0; e < n; e++) g += pw[e];
            }
            __syncwarp();
        }
        float sg = 0.0f;
        if (lane == 0) {
            g = g * inv_sqrt_h;
            float sign = g > 0.0f ? 1.0f : (g < 0.0f ? -1.0f : 0.0f);
            g = sqrtf(fmaxf(fabsf(g), 1e-6f)) * sign;
            sg = 1.0f / (1.0f + expf(-g));
        }
        sg = __shfl_sync(FULL_MASK, sg, 0);
        for (u64 e = lane; e < h; e += 32) out[o + e] = sg * val[t * h + e];
    }
}

// x: [rows, H] → [rows, C·H].
extern "C" __global__ void tile_streams_f32(float* y, const float* x, u64 rows, u64 c, u64 h) {
    dep_entry();
    FOR_EACH(i, rows * c * h) {
        u64 r = i / (c * h), j = i % h;
        y[i] = x[r * h + j];
    }
}

// (0 + x_0 + … + x_{C−1})·inv + 0.
extern "C" __global__ void mean_streams_f32(float* y, const float* x, u64 rows, u64 c, u64 h,
                                            float inv) {
    dep_entry();
    FOR_EACH(i, rows * h) {
        u64 r = i / h, j = i % h;
        float s = 0.0f;
        for (u64 st = 0; st < c; st++) s += x[(r * c + st) * h + j];
        y[i] = s * inv + 0.0f;
    }
}

// mean_streams(sigmoid(g)·x) in one pass: each gate, product and sum
// rounded to f32 as the three kernels above round them.
extern "C" __global__ void gated_mean_streams_f32(float* y, const float* g, const float* x,
                                                  u64 rows, u64 c, u64 h, float inv) {
    dep_entry();
    FOR_EACH(i, rows * h) {
        u64 r = i / h, j = i % h;
        float s = 0.0f;
        for (u64 st = 0; st < c; st++) {
            u64 at = (r * c + st) * h + j;
            float m = 1.0f / (expf(-g[at]) + 1.0f);
            s += m * x[at];
        }
        y[i] = s * inv + 0.0f;
    }
}

// X + concat_s(inj_s·y).
extern "C" __global__ void inject_streams_f32(float* out, const float* xs, const float* y,
                                              const float* inj, u64 rows, u64 c, u64 h) {
    dep_entry();
    FOR_EACH(i, rows * c * h) {
        u64 t = i / (c * h), s = (i / h) % c, j = i % h;
        out[i] = xs[i] + inj[t * c + s] * y[t * h + j];
    }
}

// Kimi delta attention's per-channel log-decay (GLM-5): x = f + dt_bias,
// then lb·σ(a_h·x), or −a_h·ln(1 + eˣ) (linear above 20) without a bound.
extern "C" __global__ void kda_gate_f32(float* y, const float* f, const float* a,
                                        const float* dt_bias, u64 n, u64 c, u64 dim,
                                        int has_lb, float lb) {
    dep_entry();
    FOR_EACH(i, n) {
        u64 ch = i % c;
        float x = f[i] + dt_bias[ch];
        float ah = a[ch / dim];
        y[i] = has_lb ? lb * (1.0f / (1.0f + expf(-(ah * x))))
                      : -ah * (x > 20.0f ? x : logf(1.0f + expf(x)));
    }
}
