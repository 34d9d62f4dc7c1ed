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
extern "C" __global__ void index_scores_f32(float* out, const float* q, const float* w,
                                            const float* keys, u64 rows, u64 n_keys, u64 heads,
                                            u64 dim, float scale, float w_scale) {
    dep_entry();
    FOR_EACH(i, rows * n_keys) {
        u64 r = i / n_keys, e = i % n_keys;
        float s = 0.0f;
        for (u64 h = 0; h < heads; h++) {
            float dot = dot_seq(q + (r * heads + h) * dim, keys + e * dim, (int)dim);
            s += (w[r * heads + h] * w_scale) * (fmaxf(dot, 0.0f) * scale);
        }
        out[i] = s;
    }
}
