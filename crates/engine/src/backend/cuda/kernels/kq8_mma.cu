// The fast set's routed K-quant products grouped by expert on the tensor
// cores (`stored.rs` `gather`, for prefill chunks whose experts get several
// pairs each): the tiles of `kq8_group_pairs` (up to KQ_GROUP pairs of one
// expert), a warp per 16 outputs of a tile. Per super-block the warp
// decodes its 16 weight rows into shared memory as signed bytes (with the
// sub-block scales and minima) once for the tile, then per sub-tile of 8
// pairs stages their activation bytes beside them and per 16-value
// sub-block runs one `mma.sync.m16n8k16.s8`: the exact integer dot
// products of 16 rows × 8 pairs. Each is multiplied by
// its row's integer sub-block scale and added up (`sumi`), the minima by
// the pairs' sub-block sums (`summ`): exact integers, the same ones
// `kq_dot`'s lanes and shuffles add (any order gives them). The float
// steps then run once a super-block, in block order, as `kq_dot`'s: so
// every output has the bits of `kq8_gather_*` and of the CPU fast set.
// (Run 36: the tiles' former product, a warp per output and tile on
// `dp4a`, took 37 % of a 256-row DeepSeek-V4 chunk; these are 1.8–3.6×
// faster from 1.5 to 96 pairs an expert, `cuda_bench_fast_routed_experts`;
// run 37's sub-tiles of one decode, 1.4–1.5× again from 24 pairs.)
// Sources are joined in order: this file uses `kq8.cu` and
// `kq8_grouped.cu`.
#ifndef KQ_HOST

// Warps a block (16 outputs each).
#define KQM_WARPS 4
// Sub-tiles of 8 pairs a tile holds at most: KQ_GROUP / 8.
#define KQM_SUBS (KQ_GROUP / 8)
// Bytes a staged row takes: 256 + 16, so that lane (g, c) reading word c
// of row g's 16-byte piece hits bank 4g + c (no two lanes of a fragment
// load on one bank).
#define KQM_STRIDE 272

// The exact sums of a 16 × 8 tile over 16 values (PTX ISA, m16n8k16 .s8,
// lane = 4g + c): A (weights, 16 × 16 row-major) words {row g, 4c..},
// {row g + 8, 4c..}; B (activations, 16 × 8) word {pair g, 4c..}; C
// {row g, pair 2c}, {g, 2c + 1}, {g + 8, 2c}, {g + 8, 2c + 1}.
__device__ __forceinline__ void kqm_mma(int (&c)[4], u32 a0, u32 a1, u32 b0) {
    c[0] = c[1] = c[2] = c[3] = 0;
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5}, {%6}, "
        "{%0, %1, %2, %3};"
        : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
        : "r"(a0), "r"(a1), "r"(b0));
}

// A warp's staging: 16 weight rows and 8 activation rows of one
// super-block, the rows' sub-block scales and minima, their f32 scales,
// and the pairs' 16-value sums.
struct KqmStage {
    u8 w[16 * KQM_STRIDE];
    u8 x[8 * KQM_STRIDE];
    signed char sc[16][16];
    signed char m[16][16];
    float d[16], dmin[16];
    int xs[8][16];
};

template <class F>
__device__ __forceinline__ void kq_grouped_mma(float* y, const u8* q, const float* d, u64 x_div,
                                               const u32* order, const u32* tiles,
                                               const u32* ntiles, const u8* w, u64 n, u64 k) {
    __shared__ __align__(16) KqmStage stage_s[KQM_WARPS];
    u32 wi = threadIdx.x / 32, lane = threadIdx.x & 31, g = lane / 4, c = lane % 4;
    KqmStage& st = stage_s[wi];
    u64 jb = ((u64)blockIdx.x * KQM_WARPS + wi) * 16;
    if (jb >= n) return;  // the whole warp: only warp barriers below
    u64 nb = k / KQ;
    u64 row_bytes = nb * F::BB;
    u64 nt = *ntiles;
    // The decode: lane → part p of rows lane / 8 + 4i; the staging of
    // activations: lane → 64 bytes (sub-blocks 4·(lane % 4) ..) of pair
    // lane / 4 of a sub-tile.
    u32 p = lane % 8, xp = lane / 4, xq = lane % 4;
    for (u64 t = blockIdx.y; t < nt; t += gridDim.y) {
        u32 e = tiles[3 * t], first = tiles[3 * t + 1];
        u32 cnt = tiles[3 * t + 2];
        // A tile is up to KQM_SUBS sub-tiles of 8 pairs: each super-block's
        // weights are decoded once for all of them (a 2,048-token chunk
        // gives an expert ~48 pairs, which tiles of 8 decoded 6 times).
        u32 subs = (cnt + 7) / 8;
        // Per sub-tile: the pair whose activations this lane stages, and
        // the pairs of its accumulators (pairs past the tile's count read
        // its first, never stored).
        u32 px[KQM_SUBS], p0[KQM_SUBS], p1[KQM_SUBS];
        float acc[KQM_SUBS][4];
#pragma unroll
        for (int u = 0; u < KQM_SUBS; u++) {
            u32 base = 8 * u;
            px[u] = order[first + (base + xp < cnt ? base + xp : 0)];
            p0[u] = order[first + (base + 2 * c < cnt ? base + 2 * c : 0)];
            p1[u] = order[first + (base + 2 * c + 1 < cnt ? base + 2 * c + 1 : 0)];
            acc[u][0] = acc[u][1] = acc[u][2] = acc[u][3] = 0.0f;
        }
        const u8* wexp = w + (u64)e * n * row_bytes;
        for (u64 b = 0; b < nb; b++) {
#pragma unroll
            for (int i = 0; i < 4; i++) {
                u32 r = lane / 8 + 4 * i;
                u64 j = jb + r < n ? jb + r : n - 1;
                const u8* blk = wexp + j * row_bytes + b * F::BB;
                KqPart o;
                F::part(blk, p, o);
                uint4* dst = (uint4*)(st.w + r * KQM_STRIDE + 32 * p);
                dst[0] = make_uint4(o.w[0], o.w[1], o.w[2], o.w[3]);
                dst[1] = make_uint4(o.w[4], o.w[5], o.w[6], o.w[7]);
                st.sc[r][2 * p] = (signed char)o.sc0;
                st.sc[r][2 * p + 1] = (signed char)o.sc1;
                if (F::MIN) {
                    st.m[r][2 * p] = (signed char)o.m0;
                    st.m[r][2 * p + 1] = (signed char)o.m1;
                }
                if (p == 0) {
                    float dd, dm;
                    F::scales(blk, dd, dm);
                    st.d[r] = dd;
                    st.dmin[r] = dm;
                }
            }
#pragma unroll
            for (int u = 0; u < KQM_SUBS; u++) {
                if ((u32)u >= subs) break;
                {
                    const uint4* src = (const uint4*)(q + (u64)(px[u] / x_div) * k + 64 * xq + b * KQ);
                    uint4* dst = (uint4*)(st.x + xp * KQM_STRIDE + 64 * xq);
#pragma unroll
                    for (int s = 0; s < 4; s++) {
                        uint4 v = src[s];
                        dst[s] = v;
                        if (F::MIN) {
                            int sum = __dp4a((int)v.x, 0x01010101, 0);
                            sum = __dp4a((int)v.y, 0x01010101, sum);
                            sum = __dp4a((int)v.z, 0x01010101, sum);
                            sum = __dp4a((int)v.w, 0x01010101, sum);
                            st.xs[xp][4 * xq + s] = sum;
                        }
                    }
                }
                __syncwarp();
                int sumi[4] = {0, 0, 0, 0}, summ[4] = {0, 0, 0, 0};
#pragma unroll
                for (int s = 0; s < 16; s++) {
                    u32 a0 = *(const u32*)(st.w + g * KQM_STRIDE + 16 * s + 4 * c);
                    u32 a1 = *(const u32*)(st.w + (g + 8) * KQM_STRIDE + 16 * s + 4 * c);
                    u32 b0 = *(const u32*)(st.x + g * KQM_STRIDE + 16 * s + 4 * c);
                    int cc[4];
                    kqm_mma(cc, a0, a1, b0);
                    int s0 = st.sc[g][s], s1 = st.sc[g + 8][s];
                    sumi[0] += s0 * cc[0];
                    sumi[1] += s0 * cc[1];
                    sumi[2] += s1 * cc[2];
                    sumi[3] += s1 * cc[3];
                    if (F::MIN) {
                        int m0 = st.m[g][s], m1 = st.m[g + 8][s];
                        int x0 = st.xs[2 * c][s], x1 = st.xs[2 * c + 1][s];
                        summ[0] += m0 * x0;
                        summ[1] += m0 * x1;
                        summ[2] += m1 * x0;
                        summ[3] += m1 * x1;
                    }
                }
                // The super-block's float steps (`kq_dot`'s, the same
                // operands).
                float a0 = d[(u64)(p0[u] / x_div) * nb + b], a1 = d[(u64)(p1[u] / x_div) * nb + b];
                float dr0 = st.d[g], dr1 = st.d[g + 8];
                acc[u][0] = fmaf(dr0 * a0, (float)sumi[0], acc[u][0]);
                acc[u][1] = fmaf(dr0 * a1, (float)sumi[1], acc[u][1]);
                acc[u][2] = fmaf(dr1 * a0, (float)sumi[2], acc[u][2]);
                acc[u][3] = fmaf(dr1 * a1, (float)sumi[3], acc[u][3]);
                if (F::MIN) {
                    float m0 = st.dmin[g], m1 = st.dmin[g + 8];
                    acc[u][0] = fmaf(-(m0 * a0), (float)summ[0], acc[u][0]);
                    acc[u][1] = fmaf(-(m0 * a1), (float)summ[1], acc[u][1]);
                    acc[u][2] = fmaf(-(m1 * a0), (float)summ[2], acc[u][2]);
                    acc[u][3] = fmaf(-(m1 * a1), (float)summ[3], acc[u][3]);
                }
                // Every lane has read the staged activations before the
                // next sub-tile's (or super-block's) are written.
                __syncwarp();
            }
        }
#pragma unroll
        for (int u = 0; u < KQM_SUBS; u++) {
#pragma unroll
            for (int i = 0; i < 4; i++) {
                u32 pi = 8 * u + 2 * c + (i % 2);
                u64 j = jb + g + 8 * (i / 2);
                if (pi < cnt && j < n) y[(u64)(i % 2 ? p1[u] : p0[u]) * n + j] = acc[u][i];
            }
        }
    }
}

// The kernels, one per format (`stored.rs` names them; written out: the
// signature check reads every kernel's name and first statement).
extern "C" __global__ void kq8_mma_q2_k(float* y, const u8* q, const float* d, u64 x_div,
        const u32* order, const u32* tiles, const u32* ntiles, const u8* w, u64 n, u64 k) {
    dep_entry();
    kq_grouped_mma<KqQ2K>(y, q, d, x_div, order, tiles, ntiles, w, n, k);
}
extern "C" __global__ void kq8_mma_q3_k(float* y, const u8* q, const float* d, u64 x_div,
        const u32* order, const u32* tiles, const u32* ntiles, const u8* w, u64 n, u64 k) {
    dep_entry();
    kq_grouped_mma<KqQ3K>(y, q, d, x_div, order, tiles, ntiles, w, n, k);
}
extern "C" __global__ void kq8_mma_q4_k(float* y, const u8* q, const float* d, u64 x_div,
        const u32* order, const u32* tiles, const u32* ntiles, const u8* w, u64 n, u64 k) {
    dep_entry();
    kq_grouped_mma<KqQ45K<0>>(y, q, d, x_div, order, tiles, ntiles, w, n, k);
}
extern "C" __global__ void kq8_mma_q5_k(float* y, const u8* q, const float* d, u64 x_div,
        const u32* order, const u32* tiles, const u32* ntiles, const u8* w, u64 n, u64 k) {
    dep_entry();
    kq_grouped_mma<KqQ45K<1>>(y, q, d, x_div, order, tiles, ntiles, w, n, k);
}
extern "C" __global__ void kq8_mma_q6_k(float* y, const u8* q, const float* d, u64 x_div,
        const u32* order, const u32* tiles, const u32* ntiles, const u8* w, u64 n, u64 k) {
    dep_entry();
    kq_grouped_mma<KqQ6K>(y, q, d, x_div, order, tiles, ntiles, w, n, k);
}
extern "C" __global__ void kq8_mma_iq2_xxs(float* y, const u8* q, const float* d, u64 x_div,
        const u32* order, const u32* tiles, const u32* ntiles, const u8* w, u64 n, u64 k) {
    dep_entry();
    kq_iq2_tables();
    kq_grouped_mma<KqIq2xxs>(y, q, d, x_div, order, tiles, ntiles, w, n, k);
}

#endif  // KQ_HOST
