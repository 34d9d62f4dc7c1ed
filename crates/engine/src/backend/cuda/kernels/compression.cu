// Token compression (`cpu::compression`): gated softmax pooling and the
// lightning indexer's scores, one thread per output element in the CPU's
// order.

// kv, gate: [n·slots, dim] → [n, dim].
extern "C" __global__ void softmax_pool_f32(float* out, const float* kv, const float* gate,
                                            u64 n, u64 slots, u64 dim) {
    dep_entry();
    FOR_EACH(i, n * dim) {
        u64 g = i / dim, c = i % dim;
        const float* kg = kv + g * slots * dim;
        const float* gg = gate + g * slots * dim;
        float mx = DS4_NEG_INF;
        for (u64 j = 0; j < slots; j++) mx = fmaxf(mx, gg[j * dim + c]);
        float sum = 0.0f;
        for (u64 j = 0; j < slots; j++) sum += expf(gg[j * dim + c] - mx);
        float acc = 0.0f;
        for (u64 j = 0; j < slots; j++) acc += kg[j * dim + c] * (expf(gg[j * dim + c] - mx) / sum);
        out[i] = acc;
    }
}

// s[r, e] = Σ_h (w[r, h]·w_scale)·(max(q[r, h]·keys[e], 0)·scale).
// One warp per (r, e): lane j computes head h = h0 + j's term (its dot in
// the CPU's sequence), lane 0 adds the 32 terms in head order, so the sum
// is the CPU's sequential one. A thread per (r, e) summing every head itself
// was one block for a decode step's ~100 keys (run 31: 200 µs a launch,
// 3 ms of a DeepSeek-V4 step).
extern "C" __global__ void index_scores_f32(float* out, const float* q, const float* w,
                                            const float* keys, u64 rows, u64 n_keys, u64 heads,
                                            u64 dim, float scale, float w_scale) {
    dep_entry();
    unsigned lane = threadIdx.x & 31;
    u64 warps = (u64)gridDim.x * (blockDim.x / 32);
    for (u64 i = (u64)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32; i < rows * n_keys;
         i += warps) {
        u64 r = i / n_keys, e = i % n_keys;
        float s = 0.0f;
        for (u64 h0 = 0; h0 < heads; h0 += 32) {
            u64 h = h0 + lane;
            float term = 0.0f;
            if (h < heads) {
                float dot = dot_seq(q + (r * heads + h) * dim, keys + e * dim, (int)dim);
                term = (w[r * heads + h] * w_scale) * (fmaxf(dot, 0.0f) * scale);
            }
            u64 m = heads - h0 < 32 ? heads - h0 : 32;
            for (u64 j = 0; j < 32; j++) {
                float t = __shfl_sync(FULL_MASK, term, (int)j);
                if (j < m) s += t;
            }
        }
        if (lane == 0) out[i] = s;
    }
}
