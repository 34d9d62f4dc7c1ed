// The recurrent mixers (`cpu::delta_rule`): the depthwise causal conv and
// the gated delta rule, token by token in every path (prefill, decode,
// verify), never a chunked form.

// Row q of [window | u] (hist rows, then T rows), channel c.
__device__ __forceinline__ float conv_row(const float* window, const float* u, u64 hist, u64 q,
                                          u64 channels, u64 c) {
    return q < hist ? window[q * channels + c] : u[(q - hist) * channels + c];
}

// out[t, c] = silu(Σ_k w[c, k]·all[t + k·dilation, c]), taps in order from
// 0; silu(a) = a·(1/(1 + e^−a)) as the CPU's conv. Every conv kernel
// computes its outputs here, so all have the same bits.
__device__ __forceinline__ float conv_silu_at(const float* u, const float* window, const float* w,
                                              u64 t, u64 c, u64 channels, u64 kernel,
                                              u64 dilation, u64 hist) {
    float acc = 0.0f;
    for (u64 k = 0; k < kernel; k++)
        acc += w[c * kernel + k] * conv_row(window, u, hist, t + k * dilation, channels, c);
    return acc * (1.0f / (1.0f + expf(-acc)));
}

extern "C" __global__ void causal_conv_silu_f32(float* out, const float* u, const float* window,
                                                const float* w, u64 t_len, u64 channels,
                                                u64 kernel, u64 dilation, u64 hist) {
    dep_entry();
    FOR_EACH(i, t_len * channels) {
        out[i] = conv_silu_at(u, window, w, i / channels, i % channels, channels, kernel, dilation,
                              hist);
    }
}

// The slid window: the last `hist` rows of [window | u] (a new buffer: the
// old window is still being read).
extern "C" __global__ void conv_window_f32(float* next, const float* u, const float* window,
                                           u64 t_len, u64 channels, u64 hist) {
    dep_entry();
    FOR_EACH(i, hist * channels) {
        u64 q = i / channels + t_len, c = i % channels;
        next[i] = conv_row(window, u, hist, q, channels, c);
    }
}

// Both of the above in one launch (a step of a few rows: the launch, not
// the work, is the cost): thread i computes output i and window value i
// with the formulas above. `next` is a new buffer, so no thread reads
// what another writes.
extern "C" __global__ void causal_conv_silu_window_f32(float* out, float* next, const float* u,
                                                       const float* window, const float* w,
                                                       u64 t_len, u64 channels, u64 kernel,
                                                       u64 dilation, u64 hist) {
    dep_entry();
    u64 n_out = t_len * channels, n_next = hist * channels;
    FOR_EACH(i, n_out > n_next ? n_out : n_next) {
        u64 c = i % channels;
        if (i < n_out)
            out[i] = conv_silu_at(u, window, w, i / channels, c, channels, kernel, dilation, hist);
        if (i < n_next) next[i] = conv_row(window, u, hist, i / channels + t_len, channels, c);
    }
}

// A gated delta net's scan inputs for a step of a few rows in one launch
// (`Backend::delta_inputs`; the launches, not the work, were the cost:
// five of 2.3–3.4 µs a layer). Threads [0, 32·heads) are warps, one per q
// head then k head of each row: its dk conv outputs (`conv_silu_at`)
// stored, their sum of squares as `slice_sumsq` reads them, then
// `l2_norm_heads`' scaling. The rest take one value each: a v channel, a
// value of the slid window, a decay (`softplus_decay_at`). Each value has
// the formula of the kernel it replaces (the conv, `split_cols4`, the two
// norms, `softplus_decay_f32`), so the bits of the five launches.
// Values a lane keeps in registers (heads of dk ≤ 256; longer ones go
// through memory).
#define DELTA_REG 8
extern "C" __global__ void delta_inputs_f32(float* q, float* k, float* v, float* g, float* next,
                                            const float* u, const float* window, const float* w,
                                            const float* a, const float* neg_a,
                                            const float* dt_bias, u64 t_len, u64 hk, u64 dk,
                                            u64 vd, u64 hv, u64 kernel, float q_scale) {
    dep_entry();
    u64 kd = hk * dk, channels = 2 * kd + vd, hist = kernel - 1;
    u64 heads = 2 * t_len * hk;
    u64 n_v = t_len * vd, n_next = hist * channels, n_g = t_len * hv;
    unsigned lane = threadIdx.x & 31;
    // The grid-stride step is a multiple of 32 and so is 32·heads: a warp's
    // lanes always take the same branch.
    FOR_EACH(i, 32 * heads + n_v + n_next + n_g) {
        if (i < 32 * heads) {
            u64 h = i / 32;
            bool is_k = h >= t_len * hk;
            u64 th = is_k ? h - t_len * hk : h;  // t·hk + head
            float* xs = (is_k ? k : q) + th * dk;
            u64 c0 = (is_k ? kd : 0) + (th % hk) * dk, t = th / hk;
            float scale = is_k ? 1.0f : q_scale;
            if (dk <= 32 * DELTA_REG) {
                // The lane's values in registers, so no load waits for a
                // store: `slice_sumsq`'s sum (lane's indices in order, the
                // butterfly) and `l2_norm_heads`' product on them.
                float x[DELTA_REG];
                if (kernel == 4) {
#pragma unroll
                    for (int m = 0; m < DELTA_REG; m++) {
                        u64 j = lane + 32 * (u64)m;
                        if (j < dk)
                            x[m] = conv_silu_at(u, window, w, t, c0 + j, channels, 4, 1, 3);
                    }
                } else {
#pragma unroll
                    for (int m = 0; m < DELTA_REG; m++) {
                        u64 j = lane + 32 * (u64)m;
                        if (j < dk)
                            x[m] = conv_silu_at(u, window, w, t, c0 + j, channels, kernel, 1, hist);
                    }
                }
                float a = 0.0f;
#pragma unroll
                for (int m = 0; m < DELTA_REG; m++)
                    if (lane + 32 * (u64)m < dk) a += x[m] * x[m];
                float f = (1.0f / sqrtf(warp_sum(a) + 1e-6f)) * scale;
#pragma unroll
                for (int m = 0; m < DELTA_REG; m++) {
                    u64 j = lane + 32 * (u64)m;
                    if (j < dk) xs[j] = x[m] * f;
                }
                continue;
            }
            for (u64 j = lane; j < dk; j += 32)
                xs[j] = conv_silu_at(u, window, w, t, c0 + j, channels, kernel, 1, hist);
            float inv = 1.0f / sqrtf(slice_sumsq(xs, dk) + 1e-6f);
            __syncwarp();
            for (u64 j = lane; j < dk; j += 32) xs[j] *= inv * scale;
            continue;
        }
        u64 e = i - 32 * heads;
        if (e < n_v) {
            v[e] = conv_silu_at(u, window, w, e / vd, 2 * kd + e % vd, channels, kernel, 1, hist);
        } else if (e - n_v < n_next) {
            e -= n_v;
            next[e] = conv_row(window, u, hist, e / channels + t_len, channels, e % channels);
        } else {
            e -= n_v + n_next;
            g[e] = softplus_decay_at(a[e], neg_a, dt_bias, e % hv);
        }
    }
}

// One thread per (value head j, value column b) owns column b of S_j
// [dk, dv] across all tokens: decay, kv = Σ_a S[a,b]·k_a (in order), delta
// = (v_b − kv)·β, then S[a,b] += k_a·delta and o_b += S[a,b]·q_a (in order
// of a). `per_channel`: g is [T, Hv, dk] (KDA), else [T, Hv] (GDN).
extern "C" __global__ void delta_rule_scan_f32(float* o, float* s, const float* q,
                                               const float* k, const float* v, const float* g,
                                               const float* beta, u64 t_len, u64 hk, u64 hv,
                                               u64 dk, u64 dv, int per_channel) {
    dep_entry();
    FOR_EACH(i, hv * dv) {
        u64 j = i / dv, b = i % dv;
        u64 kh = j / (hv / hk);
        float* sj = s + j * dk * dv + b;
        for (u64 t = 0; t < t_len; t++) {
            const float* qv = q + (t * hk + kh) * dk;
            const float* kv = k + (t * hk + kh) * dk;
            if (per_channel) {
                const float* gj = g + (t * hv + j) * dk;
                for (u64 a = 0; a < dk; a++) sj[a * dv] *= expf(gj[a]);
            } else {
                float decay = expf(g[t * hv + j]);
                for (u64 a = 0; a < dk; a++) sj[a * dv] *= decay;
            }
            float mem = 0.0f;
            for (u64 a = 0; a < dk; a++) mem += sj[a * dv] * kv[a];
            float delta = (v[(t * hv + j) * dv + b] - mem) * beta[t * hv + j];
            float acc = 0.0f;
            for (u64 a = 0; a < dk; a++) {
                float x = sj[a * dv] + kv[a] * delta;
                sj[a * dv] = x;
                acc += x * qv[a];
            }
            o[(t * hv + j) * dv + b] = acc;
        }
    }
}

// The same recurrence with the state column in registers for the common
// key sizes: S is read once and written once per call instead of three
// times per token, and the loops unroll. Every element goes through the
// operations of `delta_rule_scan_f32` in the same order, so the two agree
// bit for bit (which one runs depends on dk alone).
// Keys per chunk of the register scans' dot and update loops.
#define SCAN_CHUNK 32
// Column b of value head j's state through t_len rows (`delta_rule_scan_reg`
// for one column).
template <int DK>
__device__ __forceinline__ void scan_column(float* o, float* s, const float* q, const float* k,
                                            const float* v, const float* g, const float* beta,
                                            u64 t_len, u64 hk, u64 hv, u64 dv, int per_channel,
                                            u64 j, u64 b) {
    {
        u64 kh = j / (hv / hk);
        float* sj = s + j * DK * dv + b;
        float sc[DK];
#pragma unroll
        for (int a = 0; a < DK; a++) sc[a] = sj[a * dv];
        for (u64 t = 0; t < t_len; t++) {
            const float* qv = q + (t * hk + kh) * DK;
            const float* kv = k + (t * hk + kh) * DK;
            if (per_channel) {
                const float* gj = g + (t * hv + j) * DK;
#pragma unroll
                for (int a = 0; a < DK; a++) sc[a] *= expf(gj[a]);
            } else {
                float decay = expf(g[t * hv + j]);
#pragma unroll
                for (int a = 0; a < DK; a++) sc[a] *= decay;
            }
            float mem = 0.0f;
#pragma unroll
            for (int a0 = 0; a0 < DK; a0 += SCAN_CHUNK) {
                // Keys loaded a chunk at a time (the empty asm keeps loads
                // from moving across chunks; the operations and their
                // order are unchanged): with every load of the unrolled
                // loop hoisted, the keys and the state column together
                // spilled out of registers (spill instructions 206 → 129,
                // decode 1.01–1.02×, run 19).
                asm volatile("" ::: "memory");
#pragma unroll
                for (int a = a0; a < a0 + SCAN_CHUNK; a++) mem += sc[a] * kv[a];
            }
            float delta = (v[(t * hv + j) * dv + b] - mem) * beta[t * hv + j];
            float acc = 0.0f;
#pragma unroll
            for (int a0 = 0; a0 < DK; a0 += SCAN_CHUNK) {
                asm volatile("" ::: "memory");
#pragma unroll
                for (int a = a0; a < a0 + SCAN_CHUNK; a++) {
                    float x = sc[a] + kv[a] * delta;
                    sc[a] = x;
                    acc += x * qv[a];
                }
            }
            o[(t * hv + j) * dv + b] = acc;
        }
#pragma unroll
        for (int a = 0; a < DK; a++) sj[a * dv] = sc[a];
    }
}

template <int DK>
__device__ __forceinline__ void delta_rule_scan_reg(float* o, float* s, const float* q,
                                                    const float* k, const float* v,
                                                    const float* g, const float* beta,
                                                    u64 t_len, u64 hk, u64 hv, u64 dv,
                                                    int per_channel) {
    FOR_EACH(i, hv * dv) {
        scan_column<DK>(o, s, q, k, v, g, beta, t_len, hk, hv, dv, per_channel, i / dv, i % dv);
    }
}

// Several sessions' scans in one launch (continuous batching): session p's
// entry is table[8p ..]: its state, q, k, v, g and β (its own buffers),
// the first row of its output in o, its rows. Each column goes through
// `scan_column` on its own session's rows and state, so the bits of that
// session's scan alone.
template <int DK>
__device__ __forceinline__ void delta_rule_scan_parts_reg(float* o, const u64* table,
                                                          u64 n_parts, u64 hk, u64 hv, u64 dv,
                                                          int per_channel) {
    FOR_EACH(i, n_parts * hv * dv) {
        u64 c = i % (hv * dv);
        const u64* t = table + 8 * (i / (hv * dv));
        scan_column<DK>(o + t[6] * hv * dv, (float*)t[0], (const float*)t[1], (const float*)t[2],
                        (const float*)t[3], (const float*)t[4], (const float*)t[5], t[7], hk, hv,
                        dv, per_channel, c / dv, c % dv);
    }
}

extern "C" __global__ void delta_rule_scan_dk128_f32(float* o, float* s, const float* q,
                                                     const float* k, const float* v,
                                                     const float* g, const float* beta,
                                                     u64 t_len, u64 hk, u64 hv, u64 dv,
                                                     int per_channel) {
    dep_entry();
    delta_rule_scan_reg<128>(o, s, q, k, v, g, beta, t_len, hk, hv, dv, per_channel);
}

extern "C" __global__ void delta_rule_scan_dk64_f32(float* o, float* s, const float* q,
                                                    const float* k, const float* v,
                                                    const float* g, const float* beta,
                                                    u64 t_len, u64 hk, u64 hv, u64 dv,
                                                    int per_channel) {
    dep_entry();
    delta_rule_scan_reg<64>(o, s, q, k, v, g, beta, t_len, hk, hv, dv, per_channel);
}

extern "C" __global__ void delta_rule_scan_parts_dk128_f32(float* o, const u64* table,
                                                           u64 n_parts, u64 hk, u64 hv, u64 dv,
                                                           int per_channel) {
    dep_entry();
    delta_rule_scan_parts_reg<128>(o, table, n_parts, hk, hv, dv, per_channel);
}

extern "C" __global__ void delta_rule_scan_parts_dk64_f32(float* o, const u64* table, u64 n_parts,
                                                          u64 hk, u64 hv, u64 dv,
                                                          int per_channel) {
    dep_entry();
    delta_rule_scan_parts_reg<64>(o, table, n_parts, hk, hv, dv, per_channel);
}
