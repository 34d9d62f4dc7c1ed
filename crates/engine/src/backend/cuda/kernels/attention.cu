// Attention over caches (`cpu::attention`, `cpu::sparse_attention`,
// `cpu::window_attention`) as fixed key tiles merged in tile order: the keys
// of a (query, head), numbered j = 0 .. n in the CPU's key order, are cut
// into tiles of ATT_TILE by j alone. A warp per (query, head, tile) scores
// its keys (a lane per key, the CPU's dot), takes the tile max m_t (warp
// max, exact), p = exp(s − m_t), l_t = Σ p in key order and acc_t = Σ p·v
// in key order (lanes over the output dims). A warp per (query, head) then
// merges the tiles in order: M = max(m_t, sink), Σ = Σ_t l_t·e^(m_t − M)
// (then the sink's term), o = (Σ_t acc_t·e^(m_t − M)) / Σ. Tiles past a
// query's keys are written empty (m = −∞, l = 0, acc = 0) and add exact
// zeros, so the bits of a (query, head) depend on its own keys only, never
// on the rows or the longest query of the call.

#define FOR_EACH_WARP(s, n)                                                          \
    for (u64 s = (u64)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32; s < (u64)(n); \
         s += (u64)gridDim.x * (blockDim.x / 32))

#define ATT_TILE 64
// Output dims per lane per pass (head dims up to 256 in one pass).
#define ATT_DIMS 8
// Warps per block of the tile kernels (their shared p rows).
#define ATT_WARPS 4

// Keys of attention_causal: rows of one kv head's cache [P, d].
struct CacheKeys {
    const float* k;
    const float* v;
    u64 d;
    __device__ __forceinline__ const float* key(u64 j) const { return k + j * d; }
    __device__ __forceinline__ const float* val(u64 j) const { return v + j * d; }
};

// Keys of attention_gathered: the selected rows of a [P, Hkv·d] cache.
struct GatherKeys {
    const float* kbase;
    const float* vbase;
    const u32* idx;
    u64 stride;
    __device__ __forceinline__ const float* key(u64 j) const { return kbase + (u64)idx[j] * stride; }
    __device__ __forceinline__ const float* val(u64 j) const { return vbase + (u64)idx[j] * stride; }
};

// Keys of attention_window: its window rows lo .. hi, then entries (a
// prefix, or the listed ones); keys are their own values.
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

// A tile's partial once its p row is in `sp` (this warp's, shared): l = Σ p
// in key order, each output dim's Σ p·v in key order (`DIMS` dims a lane a
// pass, `UNROLL` keys unrolled), value row i at `val[i]`; then m and l.
template <int DIMS, int UNROLL, typename Rows>
__device__ __forceinline__ void tile_sums(float* part, const float* sp, const Rows& val, u64 cnt,
                                          float m, u64 d) {
    unsigned lane = threadIdx.x & 31;
    float l = 0.0f;
    for (u64 i = 0; i < cnt; i++) l += sp[i];
    for (u64 e0 = 0; e0 < d; e0 += 32 * DIMS) {
        float acc[DIMS];
#pragma unroll
        for (int t = 0; t < DIMS; t++) acc[t] = 0.0f;
#pragma unroll UNROLL
        for (u64 i = 0; i < cnt; i++) {
            float p = sp[i];
            const float* vj = val[i];
#pragma unroll
            for (int t = 0; t < DIMS; t++) {
                u64 e = e0 + lane + 32 * t;
                if (e < d) acc[t] += p * vj[e];
            }
        }
#pragma unroll
        for (int t = 0; t < DIMS; t++) {
            u64 e = e0 + lane + 32 * t;
            if (e < d) part[2 + e] = acc[t];
        }
    }
    if (lane == 0) {
        part[0] = cnt ? m : DS4_NEG_INF;
        part[1] = l;
    }
    __syncwarp();
}

// Staged value rows: row i at `vs + i·d`.
struct StagedRows {
    const float* vs;
    u64 d;
    __device__ __forceinline__ const float* operator[](u64 i) const { return vs + i * d; }
};

// One tile's partial (m, l, acc[d]) at `part`. `scaled`: the query is
// already scaled and dots run in the CPU attention's 8-lane order; else a
// sequential dot times `scale`.
template <typename Keys>
__device__ __forceinline__ void tile_partial(float* part, const float* qh, const Keys& keys,
                                             u64 n, u64 tile, u64 d, int scaled, float scale) {
    __shared__ float sp_all[ATT_WARPS][ATT_TILE];
    // The tile's value rows, looked up once by the lane that scores the
    // key (a gathered key's row is behind an index load): the Σ p·v loop
    // then has no dependent load before each row's values.
    __shared__ const float* vp_all[ATT_WARPS][ATT_TILE];
    unsigned lane = threadIdx.x & 31;
    float* sp = sp_all[(threadIdx.x / 32) % ATT_WARPS];
    const float** vp = vp_all[(threadIdx.x / 32) % ATT_WARPS];
    u64 j0 = tile * ATT_TILE;
    u64 cnt = j0 < n ? (n - j0 < ATT_TILE ? n - j0 : ATT_TILE) : 0;
    // The tile's key and value rows asked of L2 all at once: the dots
    // below load a row DOT_AHEAD float4s at a time, and a decode step's few
    // warps otherwise waited a DRAM latency for each group.
    for (int h = 0; h < 2; h++) {
        u64 i = lane + 32 * h;
        if (i < cnt) {
            prefetch_l2(keys.key(j0 + i), d * 4, 0, 1);
            prefetch_l2(keys.val(j0 + i), d * 4, 0, 1);
        }
    }
    float s[2] = {DS4_NEG_INF, DS4_NEG_INF};
    for (int h = 0; h < 2; h++) {
        u64 i = lane + 32 * h;
        if (i < cnt) {
            const float* kj = keys.key(j0 + i);
            vp[i] = keys.val(j0 + i);
            s[h] = scaled ? dot8_attn(qh, kj, (int)d) : dot_seq(qh, kj, (int)d) * scale;
        }
    }
    float m = warp_max(fmaxf(s[0], s[1]));
    for (int h = 0; h < 2; h++) {
        u64 i = lane + 32 * h;
        sp[i] = i < cnt ? expf(s[h] - m) : 0.0f;
    }
    __syncwarp();
    tile_sums<ATT_DIMS, 8>(part, sp, vp, cnt, m, d);
}

// Threads of a block that computes one tile (`tile_partial_block`), and
// the dims of a key chunk it stages.
#define ATT_BLOCK 128
#define ATT_CHUNK 64

// `tile_partial` for a sequential dot times `scale`, a block per tile, with
// its bits: key j's score is the same chain -0 + a_0·b_0 + a_1·b_1 + … (each
// product rounded, then added in dim order) times `scale`, the max is exact
// in any order, l adds the same p in key order, and each output dim adds
// p·v in key order. What changes is who loads what: the block reads the
// tile's key rows ATT_CHUNK dims at a time, a warp along a row (coalesced),
// and keeps the products in shared memory, where thread j adds its key's
// in order. With a lane per key, each load of a warp touched 32 rows, and a
// decode step's 24 heads × 8 tiles of gathered attention took 42 µs a
// launch (ncu, run 20) on an L1 busy with those scattered requests.
template <typename Keys>
__device__ __forceinline__ void tile_partial_block(float* part, const float* qh, const Keys& keys,
                                                   u64 n, u64 tile, u64 d, float scale) {
    __shared__ float prod[ATT_CHUNK][ATT_TILE + 1];
    __shared__ const float* kp[ATT_TILE];
    __shared__ const float* vp[ATT_TILE];
    __shared__ float sp[ATT_TILE];
    __shared__ float wmax[ATT_BLOCK / 32];
    unsigned tid = threadIdx.x, lane = tid & 31, warp = tid / 32;
    u64 j0 = tile * ATT_TILE;
    u64 cnt = j0 < n ? (n - j0 < ATT_TILE ? n - j0 : ATT_TILE) : 0;
    if (tid < cnt) {
        kp[tid] = keys.key(j0 + tid);
        vp[tid] = keys.val(j0 + tid);
    }
    __syncthreads();
    float s = -0.0f;
    for (u64 c0 = 0; c0 < d; c0 += ATT_CHUNK) {
        // Warp w loads dims c0 + lane, then c0 + 32 + lane, of keys w,
        // w + 4, …: a row's 32 dims a load (coalesced), 16 loads in flight.
        u64 dims = d - c0 < ATT_CHUNK ? d - c0 : ATT_CHUNK;
#pragma unroll
        for (int h = 0; h < ATT_CHUNK / 32; h++) {
            u64 e = lane + 32 * h;
            if (e < dims) {
                float qe = qh[c0 + e];
                float kv[ATT_TILE / (ATT_BLOCK / 32)];
#pragma unroll
                for (int i = 0; i < ATT_TILE / (ATT_BLOCK / 32); i++) {
                    u64 j = warp + (ATT_BLOCK / 32) * i;
                    kv[i] = j < cnt ? __ldg(kp[j] + c0 + e) : 0.0f;
                }
#pragma unroll
                for (int i = 0; i < ATT_TILE / (ATT_BLOCK / 32); i++)
                    prod[e][warp + (ATT_BLOCK / 32) * i] = qe * kv[i];
            }
        }
        __syncthreads();
        if (tid < cnt)
            for (u64 e = 0; e < dims; e++) s += prod[e][tid];
        __syncthreads();
    }
    float sc = tid < cnt ? s * scale : DS4_NEG_INF;
    float m = warp_max(sc);
    if (lane == 0) wmax[warp] = m;
    __syncthreads();
    m = wmax[0];
    for (int w = 1; w < ATT_BLOCK / 32; w++) m = fmaxf(m, wmax[w]);
    if (tid < ATT_TILE) sp[tid] = tid < cnt ? expf(sc - m) : 0.0f;
    __syncthreads();
    for (u64 e = tid; e < d; e += ATT_BLOCK) {
        float acc = 0.0f;
#pragma unroll 16
        for (u64 i = 0; i < cnt; i++) acc += sp[i] * __ldg(vp[i] + e);
        part[2 + e] = acc;
    }
    if (tid == 0) {
        float l = 0.0f;
        for (u64 i = 0; i < cnt; i++) l += sp[i];
        part[0] = cnt ? m : DS4_NEG_INF;
        part[1] = l;
    }
    // The next tile of this block reuses the shared arrays.
    __syncthreads();
}

// Merge the `tiles` partials at pw (stride 2 + d) of one (query, head) in
// order into its output dims chunk·32 .. +32 at o; `sink` is −∞ without
// one. A warp per (query, head, 32 dims), so a decode step's few heads
// still fill the GPU; every warp of an item computes the same M and Σ by
// the same sequence, so the split changes no bit. Each tile's factor
// e^(m_t − M) is computed once (lane t mod 32) and broadcast. Empty tiles
// (past the keys, or an unused capacity tile: m_t = −∞, l_t = 0, acc_t = 0)
// are skipped: their terms are exact +0s, and adding +0 to a sum that
// started at +0 changes nothing.
__device__ __forceinline__ void merge_chunk(float* o, const float* pw, u64 tiles, u64 d,
                                            u64 chunk, float sink) {
    unsigned lane = threadIdx.x & 31;
    u64 e = chunk * 32 + lane;
    float mx = sink;
    for (u64 t = lane; t < tiles; t += 32) mx = fmaxf(mx, pw[t * (d + 2)]);
    mx = warp_max(mx);
    if (mx == DS4_NEG_INF) {
        // No key and no sink: nothing is attended (the CPU's output stays
        // zero).
        if (e < d) o[e] = 0.0f;
        return;
    }
    float sum = 0.0f, acc = 0.0f;
    for (u64 t0 = 0; t0 < tiles; t0 += 32) {
        u64 mine = t0 + lane;
        float m_t = mine < tiles ? pw[mine * (d + 2)] : DS4_NEG_INF;
        float l_t = mine < tiles ? pw[mine * (d + 2) + 1] : 0.0f;
        // Empty: −∞ with l = 0 (a tile whose scores were all −∞ has l =
        // NaN and is kept, as the one-by-one merge kept it).
        bool empty = m_t == DS4_NEG_INF && l_t == 0.0f;
        float f_t = expf(m_t - mx);
        unsigned live = __ballot_sync(0xffffffffu, !empty);
        while (live) {
            int src = __ffs(live) - 1;
            live &= live - 1;
            float f = __shfl_sync(0xffffffffu, f_t, src);
            float l = __shfl_sync(0xffffffffu, l_t, src);
            sum += l * f;
            if (e < d) acc += pw[(t0 + src) * (d + 2) + 2 + e] * f;
        }
    }
    if (sink != DS4_NEG_INF) sum += expf(sink - mx);
    if (e < d) o[e] = acc / sum;
}

// Merge the tiles of every (query, head) in order into y [items, d]: a warp
// per (item, 32 output dims). parts: [items, tiles, 2 + d]; sinks (per
// head, items = rows·heads) or 0.
extern "C" __global__ void attention_merge_f32(float* y, const float* parts, u64 items,
                                               u64 tiles, u64 heads, u64 d,
                                               const float* sinks) {
    dep_entry();
    u64 chunks = (d + 31) / 32;
    FOR_EACH_WARP(w, items * chunks) {
        u64 item = w / chunks;
        merge_chunk(y + item * d, parts + item * tiles * (d + 2), tiles, d, w % chunks,
                    sinks ? sinks[item % heads] : DS4_NEG_INF);
    }
}

// Causal attention tiles: q [T, Hq·d] (scaled), per kv head h a cache
// kptr[h], vptr[h] of [≥ offset + T, d]; query i sees keys 0 ..= offset+i.
extern "C" __global__ void attention_causal_tiles_f32(float* parts, const float* q,
                                                      const u64* kptr, const u64* vptr,
                                                      u64 t_len, u64 hq, u64 hkv, u64 d,
                                                      u64 offset, u64 tiles) {
    dep_entry();
    FOR_EACH_WARP(w, t_len * hq * tiles) {
        u64 item = w / tiles, tile = w % tiles;
        u64 i = item / hq, qh = item % hq;
        u64 kvh = qh / (hq / hkv);
        CacheKeys keys{(const float*)kptr[kvh], (const float*)vptr[kvh], d};
        tile_partial(parts + w * (d + 2), q + item * d, keys, offset + i + 1, tile, d, 1, 1.0f);
    }
}

// Several sessions' causal attention in one launch (continuous batching):
// q [R, Hq·d] holds every session's rows one after another; row r is row
// `row_pos[r]` of session `row_part[r]`, whose window starts after
// `part_off[p]` cached positions and has `part_t[p]` rows, and whose kv
// head h lives at kv[p·2·Hkv + h] (keys) and kv[p·2·Hkv + Hkv + h]
// (values). parts is [R·Hq, max_tiles, 2 + d]: an item uses the tiles its
// session alone would (ceil((off + t)/ATT_TILE)), each computed by
// `tile_partial` as `attention_causal_tiles_f32` computes it, and
// `attention_merge_batch_f32` merges exactly those, so every row has the
// bits of its session's attention alone. The u64 arrays are one table:
// row_part and row_pos [R], part_t and part_off [P], then kv.
extern "C" __global__ void attention_causal_tiles_batch_f32(float* parts, const float* q,
                                                            const u64* table, u64 rows,
                                                            u64 n_parts, u64 hq, u64 hkv,
                                                            u64 d, u64 max_tiles) {
    dep_entry();
    const u64 *row_part = table, *row_pos = table + rows, *part_t = table + 2 * rows,
              *part_off = part_t + n_parts, *kv = part_off + n_parts;
    FOR_EACH_WARP(w, rows * hq * max_tiles) {
        u64 item = w / max_tiles, tile = w % max_tiles;
        u64 r = item / hq, qh = item % hq;
        u64 p = row_part[r], off = part_off[p];
        if (tile >= (off + part_t[p] + ATT_TILE - 1) / ATT_TILE) continue;
        u64 kvh = qh / (hq / hkv);
        CacheKeys keys{(const float*)kv[p * 2 * hkv + kvh], (const float*)kv[p * 2 * hkv + hkv + kvh],
                       d};
        tile_partial(parts + w * (d + 2), q + item * d, keys, off + row_pos[r] + 1, tile, d, 1,
                     1.0f);
    }
}

// `tile_partial` for keys and values staged in shared memory: ks [tile
// keys, d + 4] (rows padded 4 floats so eight lanes' float4 reads of eight
// rows fall in 32 different banks), vs [tile keys, d]. The same arithmetic
// in the same order — `dot8_attn` on the staged row, the exact warp max,
// l and each output dim summed in key order — so the same bits; `DIMS`
// output dims a lane (heads of at most 32·DIMS dims in one pass).
template <int DIMS>
__device__ __forceinline__ void staged_tile_partial(float* part, const float* qh, const float* ks,
                                                    const float* vs, u64 n, u64 j0, u64 d) {
    __shared__ float sp_all[ATT_WARPS][ATT_TILE];
    unsigned lane = threadIdx.x & 31;
    float* sp = sp_all[(threadIdx.x / 32) % ATT_WARPS];
    u64 cnt = j0 < n ? (n - j0 < ATT_TILE ? n - j0 : ATT_TILE) : 0;
    float s[2] = {DS4_NEG_INF, DS4_NEG_INF};
    for (int h = 0; h < 2; h++) {
        u64 i = lane + 32 * h;
        if (i < cnt) s[h] = dot8_attn(qh, ks + i * (d + 4), (int)d);
    }
    float m = warp_max(fmaxf(s[0], s[1]));
    for (int h = 0; h < 2; h++) {
        u64 i = lane + 32 * h;
        sp[i] = i < cnt ? expf(s[h] - m) : 0.0f;
    }
    __syncwarp();
    tile_sums<DIMS, 4>(part, sp, StagedRows{vs, d}, cnt, m, d);
}

// `attention_causal_tiles_batch_f32`'s partials, a block per (row group,
// kv head, tile): the block stages the tile's keys and values once
// (coalesced, into dynamic shared memory: 64·(2d + 4) floats) and its
// warps then compute every (row, query head) of the group that reads that
// kv head — where a warp per (row, head, tile) read its key rows a lane a
// row, and each kv head's rows once per query head (run 40: 133 registers,
// 18.75 % occupancy, 88 µs a layer of the SmolLM2 shape's 64-session
// step). Each partial is `staged_tile_partial`'s, the bits of
// `tile_partial`'s. The table continues the batch table: after kv,
// group_first and group_n [n_groups] (a group's first row and its rows,
// all of one session, in position order). Tiles past a group's session
// are left unwritten, as the warp kernel leaves them (the merge reads the
// session's own tiles only).
template <int DIMS>
__device__ __forceinline__ void causal_staged_batch(float* parts, const float* q, const u64* table,
                                                    u64 rows, u64 n_parts, u64 hq, u64 hkv, u64 d,
                                                    u64 max_tiles, u64 n_groups) {
    extern __shared__ float4 staged4[];
    float* ks = (float*)staged4;
    float* vs = ks + ATT_TILE * (d + 4);
    const u64 *row_part = table, *row_pos = table + rows, *part_t = table + 2 * rows,
              *part_off = part_t + n_parts, *kv = part_off + n_parts,
              *group_first = kv + n_parts * 2 * hkv, *group_n = group_first + n_groups;
    u64 per_group = hkv * max_tiles, share = hq / hkv, d4 = d / 4;
    for (u64 b = blockIdx.x; b < n_groups * per_group; b += gridDim.x) {
        u64 g = b / per_group, kvh = b / max_tiles % hkv, tile = b % max_tiles;
        u64 r0 = group_first[g], nr = group_n[g];
        u64 p = row_part[r0], off = part_off[p];
        if (tile >= (off + part_t[p] + ATT_TILE - 1) / ATT_TILE) continue;
        u64 j0 = tile * ATT_TILE, n_last = off + row_pos[r0 + nr - 1] + 1;
        u64 kc = j0 < n_last ? (n_last - j0 < ATT_TILE ? n_last - j0 : ATT_TILE) : 0;
        const float* kg = (const float*)kv[p * 2 * hkv + kvh] + j0 * d;
        const float* vg = (const float*)kv[p * 2 * hkv + hkv + kvh] + j0 * d;
        // The last block's readers are done before its rows are replaced.
        __syncthreads();
        if (aligned16(kg, vg)) {
            for (u64 x = threadIdx.x; x < kc * d4; x += blockDim.x) {
                u64 i = x / d4, c = x % d4;
                ((float4*)(ks + i * (d + 4)))[c] = ((const float4*)kg)[x];
                ((float4*)(vs + i * d))[c] = ((const float4*)vg)[x];
            }
        } else {
            for (u64 x = threadIdx.x; x < kc * d; x += blockDim.x) {
                ks[x / d * (d + 4) + x % d] = kg[x];
                vs[x] = vg[x];
            }
        }
        __syncthreads();
        for (u64 it = threadIdx.x / 32; it < nr * share; it += blockDim.x / 32) {
            u64 r = r0 + it / share, item = r * hq + kvh * share + it % share;
            staged_tile_partial<DIMS>(parts + (item * max_tiles + tile) * (d + 2), q + item * d, ks,
                                      vs, off + row_pos[r] + 1, j0, d);
        }
    }
}

extern "C" __global__ void attention_causal_staged_batch_f32(float* parts, const float* q,
                                                             const u64* table, u64 rows,
                                                             u64 n_parts, u64 hq, u64 hkv, u64 d,
                                                             u64 max_tiles, u64 n_groups) {
    dep_entry();
    causal_staged_batch<4>(parts, q, table, rows, n_parts, hq, hkv, d, max_tiles, n_groups);
}

// The same for heads of at most 64 dims (two output dims a lane).
extern "C" __global__ void attention_causal_staged_batch_d64_f32(float* parts, const float* q,
                                                                 const u64* table, u64 rows,
                                                                 u64 n_parts, u64 hq, u64 hkv,
                                                                 u64 d, u64 max_tiles,
                                                                 u64 n_groups) {
    dep_entry();
    causal_staged_batch<2>(parts, q, table, rows, n_parts, hq, hkv, d, max_tiles, n_groups);
}

extern "C" __global__ void attention_merge_batch_f32(float* y, const float* parts,
                                                     const u64* table, u64 rows, u64 n_parts,
                                                     u64 hq, u64 d, u64 max_tiles) {
    dep_entry();
    const u64 *row_part = table, *part_t = table + 2 * rows, *part_off = part_t + n_parts;
    u64 chunks = (d + 31) / 32;
    FOR_EACH_WARP(w, rows * hq * chunks) {
        u64 item = w / chunks;
        u64 p = row_part[item / hq];
        u64 tiles = (part_off[p] + part_t[p] + ATT_TILE - 1) / ATT_TILE;
        merge_chunk(y + item * d, parts + item * max_tiles * (d + 2), tiles, d, w % chunks,
                    DS4_NEG_INF);
    }
}

// Gathered attention tiles: q [T, Hq·d] unscaled, k, v [P, Hkv·d],
// selection idx [T, cap] + counts.
extern "C" __global__ void attention_gathered_tiles_f32(float* parts, const float* q,
                                                        const float* k, const float* v,
                                                        const u32* idx, const u32* counts,
                                                        u64 cap, u64 t_len, u64 hq, u64 hkv,
                                                        u64 d, float scale, u64 tiles) {
    dep_entry();
    FOR_EACH_WARP(w, t_len * hq * tiles) {
        u64 item = w / tiles, tile = w % tiles;
        u64 i = item / hq, h = item % hq;
        u64 kvh = h / (hq / hkv);
        GatherKeys keys{k + kvh * d, v + kvh * d, idx + i * cap, hkv * d};
        tile_partial(parts + w * (d + 2), q + item * d, keys, counts[i], tile, d, 0, scale);
    }
}

// `attention_gathered_tiles_f32`, a block per (query, head, tile) (same
// bits; `attention.rs` picks it for calls of few queries).
extern "C" __global__ void attention_gathered_tiles_block_f32(
    float* parts, const float* q, const float* k, const float* v, const u32* idx,
    const u32* counts, u64 cap, u64 t_len, u64 hq, u64 hkv, u64 d, float scale, u64 tiles) {
    dep_entry();
    for (u64 w = blockIdx.x; w < t_len * hq * tiles; w += gridDim.x) {
        u64 item = w / tiles, tile = w % tiles;
        u64 i = item / hq, h = item % hq;
        u64 kvh = h / (hq / hkv);
        GatherKeys keys{k + kvh * d, v + kvh * d, idx + i * cap, hkv * d};
        tile_partial_block(parts + w * (d + 2), q + item * d, keys, counts[i], tile, d, scale);
    }
}

// Query row r's keys in the window attention (its window rows, then its
// entries: mode 0 none, 1 the causal prefix by `ratio`, 2 the listed ones)
// and how many.
struct WinRow {
    WinKeys keys;
    u64 n;
};
__device__ __forceinline__ WinRow window_keys(u64 r, const float* window, const float* entries,
                                              u64 n_entries, const u32* idx, const u32* counts,
                                              u64 cap, u64 dim, u64 query_first,
                                              u64 window_first, u64 span, int mode, u64 ratio) {
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
    return WinRow{WinKeys{window, entries, listed, lo, hi - lo, dim}, hi - lo + ne};
}

// Window attention tiles (DeepSeek-V4 shared K=V over a sliding window plus
// compressed entries); mode 0: no entries, 1: causal prefix (ratio), 2:
// listed.
extern "C" __global__ void attention_window_tiles_f32(
    float* parts, const float* q, const float* window, const float* entries, u64 n_entries,
    const u32* idx, const u32* counts, u64 cap, u64 rows, u64 heads, u64 dim, u64 query_first,
    u64 window_first, u64 span, int mode, u64 ratio, float scale, u64 tiles) {
    dep_entry();
    FOR_EACH_WARP(w, rows * heads * tiles) {
        u64 item = w / tiles, tile = w % tiles;
        u64 r = item / heads;
        WinRow row = window_keys(r, window, entries, n_entries, idx, counts, cap, dim, query_first,
                                 window_first, span, mode, ratio);
        tile_partial(parts + w * (dim + 2), q + item * dim, row.keys, row.n, tile, dim, 0, scale);
    }
}

// The window attention's tile partials for a few queries (decode steps,
// verify windows), a block per (query row, tile, WS_HEADS heads): the block
// stages the tile's key rows whole (K = V, rows padded by 4 floats so a
// quarter warp's float4 reads of 8 rows fall in 32 banks; dynamic shared
// memory, 64·(dim + 4) floats) with `cp.async`, every piece asked for
// at once and one wait (run 43's load-then-store loop took 37.7 / 32.1 µs
// a decode layer; run 44: DeepSeek-V4's 32-layer step 12.99 -> 12.19 ms
// on an H100, same digest), and warp w then computes
// head h0 + w's partial from them exactly
// as `tile_partial` with `scaled` = 0 does from global memory: lane i's
// score the sequential dot times `scale`, the exact warp max, l and each
// output dim's Σ p·v in key order (`tile_sums`). So the bits are
// `attention_window_tiles_f32`'s, which read the same 64 key rows once
// per head a lane a row (64 heads of 512 dims: 47–55 µs a decode layer,
// run 38's table), and which still run for dims not a multiple of 4 or
// past `WINDOW_STAGED_DIMS_MAX`. (Run 37's blocks of 8 heads staging 32
// dims a round waited on L2 once a round.) A block has blockDim.x / 32
// heads, at most WS_HEADS (`attention.rs` chooses: a warp's partial is the
// same whichever block holds it, so the bits do not depend on it).
#define WS_HEADS 8
extern "C" __global__ void attention_window_staged_f32(
    float* parts, const float* q, const float* window, const float* entries, u64 n_entries,
    const u32* idx, const u32* counts, u64 cap, u64 rows, u64 heads, u64 dim, u64 query_first,
    u64 window_first, u64 span, int mode, u64 ratio, float scale, u64 tiles) {
    dep_entry();
    extern __shared__ float4 staged4[];
    float* ks = (float*)staged4;
    __shared__ float sp_all[WS_HEADS][ATT_TILE];
    __shared__ const float* kp[ATT_TILE];
    u32 warp = threadIdx.x / 32, lane = threadIdx.x & 31;
    u64 hb = blockDim.x / 32;
    u64 groups = (heads + hb - 1) / hb, d4 = dim / 4, stride = dim + 4;
    bool vec = aligned16(window, entries);
    for (u64 blk = blockIdx.x; blk < rows * tiles * groups; blk += gridDim.x) {
        u64 r = blk / (tiles * groups), tile = blk / groups % tiles;
        u64 h = blk % groups * hb + warp;
        WinRow row = window_keys(r, window, entries, n_entries, idx, counts, cap, dim, query_first,
                                 window_first, span, mode, ratio);
        u64 j0 = tile * ATT_TILE;
        u64 cnt = j0 < row.n ? (row.n - j0 < ATT_TILE ? row.n - j0 : ATT_TILE) : 0;
        // The last item's readers are done before its rows are replaced.
        __syncthreads();
        for (u64 i = threadIdx.x; i < cnt; i += blockDim.x) kp[i] = row.keys.key(j0 + i);
        __syncthreads();
        if (vec) {
            // Every 16-byte piece asked for at once (cp.async), then one
            // wait: a load-then-store loop had each thread wait a memory
            // latency per piece.
            for (u64 x = threadIdx.x; x < cnt * d4; x += blockDim.x) {
                u64 i = x / d4, c = x % d4;
                st_cp16((u8*)(ks + i * stride + 4 * c), (const u8*)(kp[i] + 4 * c));
            }
            st_commit();
            st_wait<0>();
        } else {
            for (u64 x = threadIdx.x; x < cnt * dim; x += blockDim.x) {
                u64 i = x / dim, c = x % dim;
                ks[i * stride + c] = kp[i][c];
            }
        }
        __syncthreads();
        if (h >= heads) continue;
        u64 item = r * heads + h;
        float* sp = sp_all[warp];
        float s[2] = {DS4_NEG_INF, DS4_NEG_INF};
        for (int t = 0; t < 2; t++) {
            u64 i = lane + 32 * t;
            if (i < cnt) s[t] = dot_seq(q + item * dim, ks + i * stride, (int)dim) * scale;
        }
        float m = warp_max(fmaxf(s[0], s[1]));
        for (int t = 0; t < 2; t++) {
            u64 i = lane + 32 * t;
            sp[i] = i < cnt ? expf(s[t] - m) : 0.0f;
        }
        __syncwarp();
        tile_sums<ATT_DIMS, 8>(parts + (item * tiles + tile) * (dim + 2), sp,
                               StagedRows{ks, stride}, cnt, m, dim);
    }
}

// The window attention's tile partials with a block per (query row, tile,
// group of HB heads): the window's keys are shared by all heads (one K = V
// row a key), so the block stages the tile's keys once, WR_QK dims at a
// time, and every head of the group scores them from shared memory. A
// warp per (row, head, tile), a lane a key, read the same 64 key rows once
// per head, 32 rows a load: the window attention took 72 of a 256-row
// chunk's 320 ms (run 36) and ~50 µs a decode layer (run 32). The
// arithmetic is `tile_partial`'s with `scaled` = 0, value for value: each
// score the sequential dot (-0 + q_0·k_0 + q_1·k_1 + …, every product
// rounded, then added in dim order) times `scale`; m the exact max; p =
// expf(s − m) for the tile's keys (0 past them); l the p's added in key
// order from 0; acc[e] the p·v added in key order from 0. So the partials,
// and after the merge every output, keep those bits (the decode digests
// of docs/GPU.md check it). HB = 32: the keys staged twice for
// DeepSeek-V4's 64 heads (at 64 a thread's 16 heads took 174 registers,
// one block an SM). For fewer than 16 rows (decode steps, verify windows)
// the warp kernel above stays: blocks of 8 heads for one row took 75–101
// µs a layer against its 47–55 (run 37), their rounds of staging waiting
// on L2 with too few blocks to hide it.
#define WR_THREADS 256
#define WR_QK 32
#define WR_PV 64
// Row strides in floats: 36 keeps float4 rows 16-byte aligned with the 8
// lanes of each quarter warp on distinct banks; 68 the same for Σ p·v.
#define WR_KS 36
#define WR_PS 68
template <int HB>
struct WinRowsSmem {
    union {
        struct {
            float k[ATT_TILE][WR_KS];  // keys × dims of a round
            float q[HB][WR_KS];        // heads × dims of a round
        } qk;
        float v[ATT_TILE][WR_PV + 1];  // keys × dims of a round
    } u;
    float p[HB][WR_PS];  // heads × keys: scores, then p
    const float* kp[ATT_TILE];
};

template <int HB>
__device__ __forceinline__ void window_rows(float* parts, const float* q, const float* window,
                                            const float* entries, u64 n_entries, const u32* idx,
                                            const u32* counts, u64 cap, u64 rows, u64 heads,
                                            u64 dim, u64 query_first, u64 window_first, u64 span,
                                            int mode, u64 ratio, float scale, u64 tiles) {
    // A thread's heads: 4 groups of HPT, a group's in registers.
    constexpr int HPT = HB / 4;
    __shared__ __align__(16) WinRowsSmem<HB> sm;
    u32 tid = threadIdx.x, lane = tid & 31, warp = tid / 32;
    // Score and Σ p·v threads: key / dim j = tid % 64, heads hg·HPT ..
    u32 j = tid % ATT_TILE, hg = tid / ATT_TILE;
    u64 groups = (heads + HB - 1) / HB;
    for (u64 blk = blockIdx.x; blk < rows * tiles * groups; blk += gridDim.x) {
        u64 r = blk / (tiles * groups), tile = blk / groups % tiles;
        u64 h0 = blk % groups * HB;
        u32 hb = heads - h0 < (u64)HB ? (u32)(heads - h0) : (u32)HB;
        WinRow row = window_keys(r, window, entries, n_entries, idx, counts, cap, dim, query_first,
                                 window_first, span, mode, ratio);
        const WinKeys& keys = row.keys;
        u64 n = row.n;
        u64 j0 = tile * ATT_TILE;
        u32 cnt = j0 < n ? (u32)(n - j0 < ATT_TILE ? n - j0 : ATT_TILE) : 0;
        float* base = parts + ((r * heads + h0) * tiles + tile) * (dim + 2);
        u64 head_stride = tiles * (dim + 2);
        __syncthreads();  // the previous item's readers are done
        if (cnt == 0) {
            // An empty tile: m = −∞, l = 0, acc = 0, as `tile_partial`.
            for (u64 i = tid; i < (u64)hb * (dim + 2); i += WR_THREADS) {
                u64 h = i / (dim + 2), e = i % (dim + 2);
                base[h * head_stride + e] = e == 0 ? DS4_NEG_INF : 0.0f;
            }
            continue;
        }
        if (tid < cnt) sm.kp[tid] = keys.key(j0 + tid);
        // Scores: thread (j, hg) keeps heads hg·HPT .. of key j.
        float s[HPT];
#pragma unroll
        for (int i = 0; i < HPT; i++) s[i] = -0.0f;
        for (u64 c0 = 0; c0 < dim; c0 += WR_QK) {
            u32 dims = dim - c0 < WR_QK ? (u32)(dim - c0) : WR_QK;
            __syncthreads();
            for (u32 i = tid; i < ATT_TILE * WR_QK; i += WR_THREADS) {
                u32 kj = i / WR_QK, e = i % WR_QK;
                sm.u.qk.k[kj][e] = kj < cnt && e < dims ? sm.kp[kj][c0 + e] : 0.0f;
            }
            for (u32 i = tid; i < HB * WR_QK; i += WR_THREADS) {
                u32 h = i / WR_QK, e = i % WR_QK;
                sm.u.qk.q[h][e] = h < hb && e < dims ? q[(r * heads + h0 + h) * dim + c0 + e] : 0.0f;
            }
            __syncthreads();
            for (u32 e = 0; e < dims; e += 4) {
                float4 kv = *(const float4*)&sm.u.qk.k[j][e];
#pragma unroll
                for (int i = 0; i < HPT; i++) {
                    float4 qv = *(const float4*)&sm.u.qk.q[hg * HPT + i][e];
                    s[i] += qv.x * kv.x;
                    if (e + 1 < dims) s[i] += qv.y * kv.y;
                    if (e + 2 < dims) s[i] += qv.z * kv.z;
                    if (e + 3 < dims) s[i] += qv.w * kv.w;
                }
            }
        }
#pragma unroll
        for (int i = 0; i < HPT; i++) sm.p[hg * HPT + i][j] = j < cnt ? s[i] * scale : DS4_NEG_INF;
        __syncthreads();
        // Per head: the exact max (lanes over keys j and j + 32), p, and l
        // in key order (lane 0).
        for (u32 h = warp; h < hb; h += WR_THREADS / 32) {
            float a = sm.p[h][lane], b = sm.p[h][lane + 32];
            float m = warp_max(fmaxf(a, b));
            sm.p[h][lane] = lane < cnt ? expf(a - m) : 0.0f;
            sm.p[h][lane + 32] = lane + 32 < cnt ? expf(b - m) : 0.0f;
            __syncwarp();
            if (lane == 0) {
                float l = 0.0f;
                for (u32 i = 0; i < cnt; i++) l += sm.p[h][i];
                base[h * head_stride] = m;
                base[h * head_stride + 1] = l;
            }
            __syncwarp();
        }
        // Σ p·v: thread (dim c0 + j, hg) adds its heads' terms in key order.
        for (u64 c0 = 0; c0 < dim; c0 += WR_PV) {
            u32 dims = dim - c0 < WR_PV ? (u32)(dim - c0) : WR_PV;
            __syncthreads();
            for (u32 i = tid; i < ATT_TILE * WR_PV; i += WR_THREADS) {
                u32 kj = i / WR_PV, e = i % WR_PV;
                sm.u.v[kj][e] = kj < cnt && e < dims ? sm.kp[kj][c0 + e] : 0.0f;
            }
            __syncthreads();
            float acc[HPT];
#pragma unroll
            for (int i = 0; i < HPT; i++) acc[i] = 0.0f;
            u32 c4 = cnt / 4 * 4;
            for (u32 k0 = 0; k0 < c4; k0 += 4) {
                float v0 = sm.u.v[k0][j], v1 = sm.u.v[k0 + 1][j];
                float v2 = sm.u.v[k0 + 2][j], v3 = sm.u.v[k0 + 3][j];
#pragma unroll
                for (int i = 0; i < HPT; i++) {
                    float4 pv = *(const float4*)&sm.p[hg * HPT + i][k0];
                    acc[i] += pv.x * v0;
                    acc[i] += pv.y * v1;
                    acc[i] += pv.z * v2;
                    acc[i] += pv.w * v3;
                }
            }
            for (u32 k0 = c4; k0 < cnt; k0++) {
                float v0 = sm.u.v[k0][j];
#pragma unroll
                for (int i = 0; i < HPT; i++) acc[i] += sm.p[hg * HPT + i][k0] * v0;
            }
            if (j < dims) {
#pragma unroll
                for (int i = 0; i < HPT; i++) {
                    u32 h = hg * HPT + i;
                    if (h < hb) base[h * head_stride + 2 + c0 + j] = acc[i];
                }
            }
        }
    }
}

// Written out (the signature check reads each kernel's first statement).
extern "C" __global__ void attention_window_rows32_f32(
    float* parts, const float* q, const float* window, const float* entries, u64 n_entries,
    const u32* idx, const u32* counts, u64 cap, u64 rows, u64 heads, u64 dim, u64 query_first,
    u64 window_first, u64 span, int mode, u64 ratio, float scale, u64 tiles) {
    dep_entry();
    window_rows<32>(parts, q, window, entries, n_entries, idx, counts, cap, rows, heads, dim,
                    query_first, window_first, span, mode, ratio, scale, tiles);
}

// Mean of each complete block of `ratio` rows: (0 + r_0 + …)/ratio.
extern "C" __global__ void block_keys_f32(float* out, const float* raw, u64 dim, u64 ratio,
                                          u64 first, u64 count) {
    dep_entry();
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
    dep_entry();
    FOR_EACH(i, rows * stride) {
        u64 r = i / stride, j = i % stride;
        if (j >= (base + r + 1) / ratio) continue;
        float sum = 0.0f;
        for (u64 h = 0; h < heads; h++)
            sum += fmaxf(dot_seq(q + (r * heads + h) * dim, blocks + j * dim, (int)dim), 0.0f);
        scores[i] = sum * scale;
    }
}

// `indexer_scores_f32` with a warp per (row, block) and a lane per head
// (heads ≤ 32): each head's dot is `dot_seq` as before, and lane 0 adds the
// clamped dots in head order from 0, so the bits are the same; a decode
// step's one row had run its blocks on one thread each, every head one
// after another (16 µs a launch under ncu, run 18).
extern "C" __global__ void indexer_scores_heads_f32(float* scores, const float* q,
                                                    const float* blocks, u64 rows, u64 stride,
                                                    u64 base, u64 heads, u64 dim, u64 ratio,
                                                    float scale) {
    dep_entry();
    unsigned lane = threadIdx.x & 31;
    FOR_EACH_WARP(i, rows * stride) {
        u64 r = i / stride, j = i % stride;
        if (j >= (base + r + 1) / ratio) continue;
        float d = lane < heads ? dot_seq(q + (r * heads + lane) * dim, blocks + j * dim, (int)dim)
                               : 0.0f;
        float sum = 0.0f;
        for (u64 h = 0; h < heads; h++) sum += fmaxf(__shfl_sync(FULL_MASK, d, (int)h), 0.0f);
        if (lane == 0) scores[i] = sum * scale;
    }
}

// Step forms of causal attention (a replayed CUDA graph): the cache length
// `offset` is step[0], and the grid covers `cap_tiles`, the tiles of the
// caches' capacity. Only the tiles an eager call at this offset would make
// (ceil((offset + t_len)/ATT_TILE)) are computed and merged, with the same
// code, so the bits are the eager launch's; parts is [items, cap_tiles, 2 + d].
extern "C" __global__ void attention_causal_tiles_step_f32(float* parts, const float* q,
                                                           const u64* kptr, const u64* vptr,
                                                           u64 t_len, u64 hq, u64 hkv, u64 d,
                                                           const u32* step, u64 cap_tiles) {
    dep_entry();
    u64 offset = step[0];
    u64 tiles = (offset + t_len + ATT_TILE - 1) / ATT_TILE;
    FOR_EACH_WARP(w, t_len * hq * cap_tiles) {
        u64 item = w / cap_tiles, tile = w % cap_tiles;
        if (tile >= tiles) continue;
        u64 i = item / hq, qh = item % hq;
        u64 kvh = qh / (hq / hkv);
        CacheKeys keys{(const float*)kptr[kvh], (const float*)vptr[kvh], d};
        tile_partial(parts + w * (d + 2), q + item * d, keys, offset + i + 1, tile, d, 1, 1.0f);
    }
}

extern "C" __global__ void attention_merge_step_f32(float* y, const float* parts, u64 items,
                                                    u64 cap_tiles, u64 t_len, u64 d,
                                                    const u32* step) {
    dep_entry();
    u64 tiles = ((u64)step[0] + t_len + ATT_TILE - 1) / ATT_TILE;
    u64 chunks = (d + 31) / 32;
    FOR_EACH_WARP(w, items * chunks) {
        u64 item = w / chunks;
        merge_chunk(y + item * d, parts + item * cap_tiles * (d + 2), tiles, d, w % chunks,
                    DS4_NEG_INF);
    }
}
