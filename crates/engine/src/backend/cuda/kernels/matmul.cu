// Row-independent matrix products, y[r, j] = Σ_i x[r, i]·w[j, i].
//
// Eight threads own one output column j (a weight row) and walk every
// activation row of the call, four at a time (the weights are read once per
// four rows). Thread l of the eight accumulates the indices ≡ l (mod 8) in
// order with FMA, and the eight partial sums are added
// ((a0+a4)+(a2+a6))+((a1+a5)+(a3+a7)), then the tail below 8 runs in order
// on thread 0: exactly the CPU reference's sequence (`cpu::f32_matmul::dot`),
// so an f32 product has the CPU's bits, and the bits of y[r, j] never depend
// on how many rows the call had.
//
// Block formats (Q8_0, Q4_1) follow the AVX2 block kernel
// (`cpu::block_matmul::avx2`): the same eight lanes accumulate fma(d·u, x)
// (d·u is exact), and Q4_1 adds the minima's share Σ_b m_b·(Σ x_b) as an
// eight-lane FMA over blocks, its tail in order, then `dot + share`.
// Device layout: scales and minima as f16 bits `[n, k/32]`, quants
// `[n, k/32, 16 or 32]` (repacked once at load).

#define MM_TILE 4

__device__ __forceinline__ unsigned group_mask() { return 0xffu << (threadIdx.x & 24); }

// ((a0+a4)+(a2+a6))+((a1+a5)+(a3+a7)) across the 8 lanes of a group; lane 0
// of the group holds the result.
__device__ __forceinline__ float group8_sum(float a, unsigned mask) {
    a += __shfl_xor_sync(mask, a, 4);
    a += __shfl_xor_sync(mask, a, 2);
    a += __shfl_xor_sync(mask, a, 1);
    return a;
}

extern "C" __global__ void matmul_f32(float* y, const float* x, u64 rows, const float* w, u64 n,
                                      u64 k) {
    u64 j = (u64)blockIdx.x * (blockDim.x / 8) + threadIdx.x / 8;
    if (j >= n) return;
    unsigned lane = threadIdx.x & 7, mask = group_mask();
    const float* wr = w + j * k;
    u64 k8 = k / 8 * 8;
    for (u64 r0 = 0; r0 < rows; r0 += MM_TILE) {
        u64 nr = rows - r0 < MM_TILE ? rows - r0 : MM_TILE;
        const float* xr = x + r0 * k;
        float acc[MM_TILE] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll 4
        for (u64 c = lane; c < k8; c += 8) {
            float wv = wr[c];
#pragma unroll
            for (int t = 0; t < MM_TILE; t++)
                if (t < nr) acc[t] = fmaf(wv, xr[t * k + c], acc[t]);
        }
#pragma unroll
        for (int t = 0; t < MM_TILE; t++) {
            float s = group8_sum(acc[t], mask);
            if (lane == 0 && t < nr) {
                for (u64 i = k8; i < k; i++) s = fmaf(wr[i], xr[t * k + i], s);
                y[(r0 + t) * n + j] = s;
            }
        }
    }
}

// Routed experts: pair p (a (token, slot)) multiplies x row p / x_div by
// expert experts[p] of the stack w [E, n, k]; y: [pairs, n]. Pairs run over
// grid.y; each output is the f32 product above.
extern "C" __global__ void matmul_f32_gather(float* y, const float* x, u64 x_div,
                                             const u32* experts, u64 pairs, const float* w,
                                             u64 n, u64 k) {
    u64 j = (u64)blockIdx.x * (blockDim.x / 8) + threadIdx.x / 8;
    if (j >= n) return;
    unsigned lane = threadIdx.x & 7, mask = group_mask();
    u64 k8 = k / 8 * 8;
    for (u64 p = blockIdx.y; p < pairs; p += gridDim.y) {
        const float* wr = w + ((u64)experts[p] * n + j) * k;
        const float* xr = x + (p / x_div) * k;
        float acc = 0.f;
#pragma unroll 4
        for (u64 c = lane; c < k8; c += 8) acc = fmaf(wr[c], xr[c], acc);
        float s = group8_sum(acc, mask);
        if (lane == 0) {
            for (u64 i = k8; i < k; i++) s = fmaf(wr[i], xr[i], s);
            y[p * n + j] = s;
        }
    }
}

// out[r, h] = Σ_s weights[r, s]·ys[r·k + s, h], slots in order from 0.
extern "C" __global__ void experts_combine(float* out, const float* ys, const float* weights,
                                           u64 rows, u64 top_k, u64 h) {
    FOR_EACH(i, rows * h) {
        u64 r = i / h, e = i % h;
        float o = 0.0f;
        for (u64 s = 0; s < top_k; s++) o += weights[r * top_k + s] * ys[(r * top_k + s) * h + e];
        out[i] = o;
    }
}

// Block sums of the activations for Q4_1's minima: lane l of 8 adds
// (x[l] + x[8+l]) + (x[16+l] + x[24+l]), then the lanes as group8_sum.
extern "C" __global__ void block_sums_f32(float* sx, const float* x, u64 blocks) {
    FOR_EACH(b, blocks) {
        const float* xb = x + b * 32;
        float v[8];
#pragma unroll
        for (int l = 0; l < 8; l++) v[l] = (xb[l] + xb[8 + l]) + (xb[16 + l] + xb[24 + l]);
        sx[b] = ((v[0] + v[4]) + (v[2] + v[6])) + ((v[1] + v[5]) + (v[3] + v[7]));
    }
}

// Unscaled value 8i + l of a block (i = 0..3) for lane l.
template <int Q4>
__device__ __forceinline__ void block_quants(const u8* q, unsigned l, float u[4]) {
    if (Q4) {
        u8 b0 = q[l], b1 = q[8 + l];
        u[0] = (float)(b0 & 0x0F);
        u[1] = (float)(b1 & 0x0F);
        u[2] = (float)(b0 >> 4);
        u[3] = (float)(b1 >> 4);
    } else {
#pragma unroll
        for (int i = 0; i < 4; i++) u[i] = (float)(signed char)q[8 * i + l];
    }
}

template <int Q4>
__device__ __forceinline__ void matmul_block(float* y, const float* x, const float* sx, u64 rows,
                                             const u16* scales, const u16* mins,
                                             const u8* quants, u64 n, u64 k) {
    const int qb = Q4 ? 16 : 32;
    u64 j = (u64)blockIdx.x * (blockDim.x / 8) + threadIdx.x / 8;
    if (j >= n) return;
    unsigned lane = threadIdx.x & 7, mask = group_mask();
    u64 nb = k / 32, nb8 = nb / 8 * 8;
    const u16* sc = scales + j * nb;
    const u8* qr = quants + j * nb * qb;
    for (u64 r0 = 0; r0 < rows; r0 += MM_TILE) {
        u64 nr = rows - r0 < MM_TILE ? rows - r0 : MM_TILE;
        const float* xr = x + r0 * k;
        float acc[MM_TILE] = {0.f, 0.f, 0.f, 0.f};
        for (u64 b = 0; b < nb; b++) {
            float d = h2f(sc[b]);
            float u[4];
            block_quants<Q4>(qr + b * qb, lane, u);
#pragma unroll
            for (int i = 0; i < 4; i++) {
                float wv = d * u[i];
                u64 at = b * 32 + 8 * i + lane;
#pragma unroll
                for (int t = 0; t < MM_TILE; t++)
                    if (t < nr) acc[t] = fmaf(wv, xr[t * k + at], acc[t]);
            }
        }
#pragma unroll
        for (int t = 0; t < MM_TILE; t++) {
            float dot = group8_sum(acc[t], mask);
            if (Q4) {
                const u16* mr = mins + j * nb;
                const float* sr = sx + (r0 + t) * nb;
                float macc = 0.f;
                if (t < nr)
                    for (u64 b = lane; b < nb8; b += 8) macc = fmaf(h2f(mr[b]), sr[b], macc);
                float share = group8_sum(macc, mask);
                if (lane == 0 && t < nr) {
                    for (u64 b = nb8; b < nb; b++) share += h2f(mr[b]) * sr[b];
                    dot = dot + share;
                }
            }
            if (lane == 0 && t < nr) y[(r0 + t) * n + j] = dot;
        }
    }
}

extern "C" __global__ void matmul_q4_1(float* y, const float* x, const float* sx, u64 rows,
                                       const u16* scales, const u16* mins, const u8* quants,
                                       u64 n, u64 k) {
    matmul_block<1>(y, x, sx, rows, scales, mins, quants, n, k);
}

extern "C" __global__ void matmul_q8_0(float* y, const float* x, u64 rows, const u16* scales,
                                       const u8* quants, u64 n, u64 k) {
    matmul_block<0>(y, x, 0, rows, scales, 0, quants, n, k);
}
