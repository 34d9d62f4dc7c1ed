// Attention over caches (`cpu::attention`, `cpu::sparse_attention`,
// `cpu::window_attention`): one warp per (query, head). The lanes score the
// keys (each lane a whole key, in the CPU's dot order) into a scratch row,
// the max is a warp max (exact), and the sums the CPU runs in key order run
// in key order here too: the softmax denominator sequentially on every lane
// (the same bits everywhere), and each output dimension's Σ p·v in key
// order on the lane that owns it. So a (query, head) never depends on the
// other rows of the call.

#define FOR_EACH_WARP(s, n)                                                          \
    for (u64 s = (u64)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32; s < (u64)(n); \
         s += (u64)gridDim.x * (blockDim.x / 32))

// Output dims per lane per pass (head dims up to 256 in one pass).
#define ATT_DIMS 8

// Causal attention: q [T, Hq·d] (scaled), per kv head h a cache
// kptr[h], vptr[h] of [≥ offset + T, d]; query i sees keys 0 ..= offset+i.
// Σ p starts at +0 and adds in key order; o = (Σ p·v)·(1/Σ p).
extern "C" __global__ void attention_causal_f32(float* y, const float* q, const u64* kptr,
                                                const u64* vptr, float* scratch, u64 t_len,
                                                u64 hq, u64 hkv, u64 d, u64 offset,
                                                u64 total) {
    unsigned lane = threadIdx.x & 31;
    FOR_EACH_WARP(w, t_len * hq) {
        u64 i = w / hq, qh = w % hq;
        u64 kvh = qh / (hq / hkv);
        const float* K = (const float*)kptr[kvh];
        const float* V = (const float*)vptr[kvh];
        const float* qr = q + (i * hq + qh) * d;
        u64 visible = offset + i + 1;
        float* sc = scratch + w * total;
        float mx = DS4_NEG_INF;
        for (u64 j = lane; j < visible; j += 32) {
            float s = dot8_attn(qr, K + j * d, (int)d);
            sc[j] = s;
            mx = fmaxf(mx, s);
        }
        mx = warp_max(mx);
        for (u64 j = lane; j < visible; j += 32) sc[j] = expf(sc[j] - mx);
        __syncwarp();
        for (u64 e0 = 0; e0 < d; e0 += 32 * ATT_DIMS) {
            float acc[ATT_DIMS];
#pragma unroll
            for (int t = 0; t < ATT_DIMS; t++) acc[t] = 0.0f;
            float sum = 0.0f;
            for (u64 j = 0; j < visible; j++) {
                float p = sc[j];
                sum += p;
                const float* vj = V + j * d;
#pragma unroll
                for (int t = 0; t < ATT_DIMS; t++) {
                    u64 e = e0 + lane + 32 * t;
                    if (e < d) acc[t] += p * vj[e];
                }
            }
            float inv = 1.0f / sum;
#pragma unroll
            for (int t = 0; t < ATT_DIMS; t++) {
                u64 e = e0 + lane + 32 * t;
                if (e < d) y[(i * hq + qh) * d + e] = acc[t] * inv;
            }
        }
        __syncwarp();
    }
}

// The keys of one query of attention_window: its window rows lo .. hi,
// then entries (a prefix of n_prefix, or the listed ones).
struct WinKeys {
    const float* window;
    const float* entries;
    const u32* listed;
    u64 lo, nw, dim;
    __device__ __forceinline__ const float* key(u64 j) const {
        if (j < nw) return window + (lo + j) * dim;
        u64 e = listed ? (u64)listed[j - nw] : j - nw;
        return entries + e * dim;
    }
    __device__ __forceinline__ const float* val(u64 j) const { return key(j); }
};

// Softmax of one (query, head) over keys(0 .. n) with an optional sink
// logit, written to o (dims on lanes): sequential dots ·scale, max with the
// sink, exp, Σ in key order then the sink's term, o = Σ (p/Σ)·v in key order.
template <typename Keys>
__device__ __forceinline__ void attend_keys(float* o, const float* qh, const Keys& keys, u64 n,
                                            u64 d, float scale, int has_sink, float sink,
                                            float* sc) {
    unsigned lane = threadIdx.x & 31;
    float mx = has_sink ? sink : DS4_NEG_INF;
    for (u64 j = lane; j < n; j += 32) {
        float s = dot_seq(qh, keys.key(j), (int)d) * scale;
        sc[j] = s;
        mx = fmaxf(mx, s);
    }
    mx = warp_max(mx);
    for (u64 j = lane; j < n; j += 32) sc[j] = expf(sc[j] - mx);
    __syncwarp();
    float sum = 0.0f;
    for (u64 j = 0; j < n; j++) sum += sc[j];
    if (has_sink) sum += expf(sink - mx);
    for (u64 e0 = 0; e0 < d; e0 += 32 * ATT_DIMS) {
        float acc[ATT_DIMS];
#pragma unroll
        for (int t = 0; t < ATT_DIMS; t++) acc[t] = 0.0f;
        for (u64 j = 0; j < n; j++) {
            float p = sc[j] / sum;
            const float* vj = keys.val(j);
#pragma unroll
            for (int t = 0; t < ATT_DIMS; t++) {
                u64 e = e0 + lane + 32 * t;
                if (e < d) acc[t] += p * vj[e];
            }
        }
#pragma unroll
        for (int t = 0; t < ATT_DIMS; t++) {
            u64 e = e0 + lane + 32 * t;
            if (e < d) o[e] = acc[t];
        }
    }
    __syncwarp();
}

// Keys of attention_gathered: the selected rows j of a [P, Hkv·d] cache.
struct GatherKeys {
    const float* kbase;
    const float* vbase;
    const u32* idx;
    u64 stride;
    __device__ __forceinline__ const float* key(u64 j) const { return kbase + (u64)idx[j] * stride; }
    __device__ __forceinline__ const float* val(u64 j) const { return vbase + (u64)idx[j] * stride; }
};

// q [T, Hq·d] unscaled, k, v [P, Hkv·d], selection idx [T, cap] + counts.
extern "C" __global__ void attention_gathered_f32(float* y, const float* q, const float* k,
                                                  const float* v, const u32* idx,
                                                  const u32* counts, u64 cap, const float* sinks,
                                                  float* scratch, u64 t_len, u64 hq, u64 hkv,
                                                  u64 d, float scale) {
    FOR_EACH_WARP(w, t_len * hq) {
        u64 i = w / hq, h = w % hq;
        u64 kvh = h / (hq / hkv);
        GatherKeys keys{k + kvh * d, v + kvh * d, idx + i * cap, hkv * d};
        attend_keys(y + (i * hq + h) * d, q + (i * hq + h) * d, keys, counts[i], d, scale,
                    sinks != 0, sinks ? sinks[h] : 0.0f, scratch + w * cap);
    }
}

// DeepSeek-V4 shared K=V attention over a sliding window plus compressed
// entries; mode 0: no entries, 1: causal prefix (ratio), 2: listed.
extern "C" __global__ void attention_window_f32(float* y, const float* q, const float* window,
                                                const float* entries, u64 n_entries,
                                                const u32* idx, const u32* counts, u64 cap,
                                                const float* sinks, float* scratch,
                                                u64 max_keys, u64 rows, u64 heads, u64 dim,
                                                u64 query_first, u64 window_first, u64 span,
                                                int mode, u64 ratio, float scale) {
    FOR_EACH_WARP(w, rows * heads) {
        u64 r = w / heads, h = w % heads;
        u64 t = query_first + r;
        u64 lo_abs = t + 1 > span ? t + 1 - span : 0;
        if (lo_abs < window_first) lo_abs = window_first;
        u64 lo = lo_abs - window_first, hi = t + 1 - window_first;
        u64 ne = 0;
        const u32* listed = 0;
        if (mode == 1) {
            ne = (t + 1) / (ratio ? ratio : 1);
            if (ne > n_entries) ne = n_entries;
        } else if (mode == 2) {
            ne = counts[r];
            listed = idx + r * cap;
        }
        WinKeys keys{window, entries, listed, lo, hi - lo, dim};
        attend_keys(y + (r * heads + h) * dim, q + (r * heads + h) * dim, keys, hi - lo + ne, dim,
                    scale, 1, sinks[h], scratch + w * max_keys);
    }
}

// Mean of each complete block of `ratio` rows: (0 + r_0 + …)/ratio.
extern "C" __global__ void block_keys_f32(float* out, const float* raw, u64 dim, u64 ratio,
                                          u64 first, u64 count) {
    FOR_EACH(i, count * dim) {
        u64 j = first + i / dim, c = i % dim;
        float kb = 0.0f;
        for (u64 t = j * ratio; t < (j + 1) * ratio; t++) kb += raw[t * dim + c];
        out[i] = kb / (float)ratio;
    }
}

// QSA block scores: row r (token base + r) scores its complete blocks j <
// (base + r + 1)/ratio: Σ_h max(q_h·kb_j, 0) (sequential dots, heads in
// order from 0) · scale. scores: [rows, stride].
extern "C" __global__ void indexer_scores_f32(float* scores, const float* q, const float* blocks,
                                              u64 rows, u64 stride, u64 base, u64 heads,
                                              u64 dim, u64 ratio, float scale) {
    FOR_EACH(i, rows * stride) {
        u64 r = i / stride, j = i % stride;
        if (j >= (base + r + 1) / ratio) continue;
        float sum = 0.0f;
        for (u64 h = 0; h < heads; h++)
            sum += fmaxf(dot_seq(q + (r * heads + h) * dim, blocks + j * dim, (int)dim), 0.0f);
        scores[i] = sum * scale;
    }
}
