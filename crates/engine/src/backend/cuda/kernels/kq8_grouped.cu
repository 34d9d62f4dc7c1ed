// The fast set's routed K-quant products grouped by expert (`stored.rs`
// `gather`): the (token, slot) pairs of a call sorted by expert into tiles
// of up to KQ_GROUP rows, so a warp reads an expert's weight row once for
// a tile instead of once per pair (`kq8_gather_*` reads it per pair, which
// made a prefill chunk read every routed expert ~12 times a layer). Each
// row's accumulation is `kq_dot`'s, independent of the other rows of its
// tile, so every output has the bits of `kq8_gather_*` (and of the CPU fast
// set); which pairs share a tile does not matter. Sources are joined in
// order: this file uses `kq8.cu`.
#ifndef KQ_HOST

#define KQ_GROUP 8
// Experts a grouping handles at most (shared counters; `stored.rs` falls
// back to the per-pair gather above it).
#define KQ_GROUP_EXPERTS 1024

// One block: per-expert counts, their starts, the tiles (expert, first
// index into `order`, rows: three words each) in expert order, `*ntiles`,
// and `order` (the pairs of each expert together; within an expert in the
// order the atomics give, which no output depends on).
extern "C" __global__ void kq8_group_pairs(u32* order, u32* tiles, u32* ntiles,
                                           const u32* experts, u64 pairs, u64 e_count) {
    dep_entry();
    __shared__ u32 counts[KQ_GROUP_EXPERTS];
    __shared__ u32 cursor[KQ_GROUP_EXPERTS];
    for (u64 e = threadIdx.x; e < e_count; e += blockDim.x) counts[e] = 0, cursor[e] = 0;
    __syncthreads();
    for (u64 p = threadIdx.x; p < pairs; p += blockDim.x) atomicAdd(&counts[experts[p]], 1u);
    __syncthreads();
    if (threadIdx.x == 0) {
        u32 start = 0, t = 0;
        for (u64 e = 0; e < e_count; e++) {
            u32 c = counts[e];
            for (u32 j = 0; j < c; j += KQ_GROUP) {
                tiles[3 * t] = (u32)e;
                tiles[3 * t + 1] = start + j;
                tiles[3 * t + 2] = c - j < KQ_GROUP ? c - j : KQ_GROUP;
                t++;
            }
            counts[e] = start;  // now the expert's first index
            start += c;
        }
        *ntiles = t;
    }
    __syncthreads();
    for (u64 p = threadIdx.x; p < pairs; p += blockDim.x) {
        u32 e = experts[p];
        order[counts[e] + atomicAdd(&cursor[e], 1u)] = (u32)p;
    }
}

// y[p, j] = W_{expert}[j] · x[p / x_div] for the pairs of each tile: a
// warp per (output element, tile).
template <class F>
__device__ __forceinline__ void kq_grouped(float* y, const u8* q, const float* d, u64 x_div,
                                           const u32* order, const u32* tiles,
                                           const u32* ntiles, const u8* w, u64 n, u64 k) {
    u64 nb = k / KQ;
    u64 row_bytes = nb * F::BB;
    u32 lane = threadIdx.x & 31;
    u64 nt = *ntiles;
    for (u64 t = blockIdx.y; t < nt; t += gridDim.y) {
        u32 e = tiles[3 * t], first = tiles[3 * t + 1];
        int cnt = (int)tiles[3 * t + 2];
        const u8* qa[KQ_GROUP];
        const float* da[KQ_GROUP];
        u32 pr[KQ_GROUP];
#pragma unroll
        for (int r = 0; r < KQ_GROUP; r++) {
            u32 p = order[first + (r < cnt ? r : 0)];
            u64 xr = p / x_div;
            pr[r] = p;
            qa[r] = q + xr * k;
            da[r] = d + xr * nb;
        }
        for (u64 j = (u64)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32; j < n;
             j += (u64)gridDim.x * (blockDim.x / 32)) {
            float acc[KQ_GROUP];
            kq_dot<F, KQ_GROUP>(w + ((u64)e * n + j) * row_bytes, qa, da, cnt, nb, acc);
            if (lane == 0) {
#pragma unroll
                for (int r = 0; r < KQ_GROUP; r++)
                    if (r < cnt) y[(u64)pr[r] * n + j] = acc[r];
            }
        }
    }
}

// The kernels, one per format (`stored.rs` names them; written out: the
// signature check reads every kernel's name and first statement).
extern "C" __global__ void kq8_grouped_q2_k(float* y, const u8* q, const float* d, u64 x_div,
        const u32* order, const u32* tiles, const u32* ntiles, const u8* w, u64 n, u64 k) {
    dep_entry();
    kq_grouped<KqQ2K>(y, q, d, x_div, order, tiles, ntiles, w, n, k);
}
extern "C" __global__ void kq8_grouped_q3_k(float* y, const u8* q, const float* d, u64 x_div,
        const u32* order, const u32* tiles, const u32* ntiles, const u8* w, u64 n, u64 k) {
    dep_entry();
    kq_grouped<KqQ3K>(y, q, d, x_div, order, tiles, ntiles, w, n, k);
}
extern "C" __global__ void kq8_grouped_q4_k(float* y, const u8* q, const float* d, u64 x_div,
        const u32* order, const u32* tiles, const u32* ntiles, const u8* w, u64 n, u64 k) {
    dep_entry();
    kq_grouped<KqQ45K<0>>(y, q, d, x_div, order, tiles, ntiles, w, n, k);
}
extern "C" __global__ void kq8_grouped_q5_k(float* y, const u8* q, const float* d, u64 x_div,
        const u32* order, const u32* tiles, const u32* ntiles, const u8* w, u64 n, u64 k) {
    dep_entry();
    kq_grouped<KqQ45K<1>>(y, q, d, x_div, order, tiles, ntiles, w, n, k);
}
extern "C" __global__ void kq8_grouped_q6_k(float* y, const u8* q, const float* d, u64 x_div,
        const u32* order, const u32* tiles, const u32* ntiles, const u8* w, u64 n, u64 k) {
    dep_entry();
    kq_grouped<KqQ6K>(y, q, d, x_div, order, tiles, ntiles, w, n, k);
}
extern "C" __global__ void kq8_grouped_iq2_xxs(float* y, const u8* q, const float* d, u64 x_div,
        const u32* order, const u32* tiles, const u32* ntiles, const u8* w, u64 n, u64 k) {
    dep_entry();
    kq_iq2_tables();
    kq_grouped<KqIq2xxs>(y, q, d, x_div, order, tiles, ntiles, w, n, k);
}

#endif  // KQ_HOST
