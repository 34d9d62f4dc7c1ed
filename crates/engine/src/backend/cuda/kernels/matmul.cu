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
// Block formats (Q8_0, Q4_1) have an order of their own (below): a warp per
// output row, which streams the quants at a much higher rate than eight
// threads could.

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

// Block formats, one warp per output row: lane l takes the blocks b ≡ l
// (mod 32) in order (16-byte quant loads, coalesced across the warp), and
// for each block the 32 weights are dequantized exactly as GGUF defines them
// (Q4_1: u·d + m, u·d exact; Q8_0: q·d, exact) and accumulated by FMA in
// index order; the 32 lane sums are added by the butterfly (`warp_sum`).
// The order depends on k alone. Device layout: `dm` holds each block's
// f16 scale (low half) and, for Q4_1, its f16 minimum (high half), `[n,
// k/32]`; `quants` `[n, k/32, 16 or 32]`.
template <int Q4>
__device__ __forceinline__ void matmul_block(float* y, const float* x, u64 rows, const u32* dm,
                                             const u8* quants, u64 n, u64 k) {
    const int qb = Q4 ? 16 : 32;
    u64 j = (u64)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (j >= n) return;
    unsigned lane = threadIdx.x & 31;
    u64 nb = k / 32;
    const u32* dmr = dm + j * nb;
    const u8* qr = quants + j * nb * qb;
    for (u64 r0 = 0; r0 < rows; r0 += MM_TILE) {
        u64 nr = rows - r0 < MM_TILE ? rows - r0 : MM_TILE;
        const float* xr = x + r0 * k;
        float acc[MM_TILE] = {0.f, 0.f, 0.f, 0.f};
        for (u64 b = lane; b < nb; b += 32) {
            u32 sm = dmr[b];
            float d = h2f((u16)(sm & 0xffff)), m = h2f((u16)(sm >> 16));
            float w[32];
            if (Q4) {
                uint4 q = *(const uint4*)(qr + b * 16);
                u32 words[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
                for (int i = 0; i < 16; i++) {
                    u32 byte = (words[i / 4] >> (8 * (i % 4))) & 0xff;
                    w[i] = (float)(byte & 0x0f) * d + m;
                    w[i + 16] = (float)(byte >> 4) * d + m;
                }
            } else {
                uint4 q0 = *(const uint4*)(qr + b * 32);
                uint4 q1 = *(const uint4*)(qr + b * 32 + 16);
                u32 words[8] = {q0.x, q0.y, q0.z, q0.w, q1.x, q1.y, q1.z, q1.w};
#pragma unroll
                for (int i = 0; i < 32; i++)
                    w[i] = (float)(signed char)((words[i / 4] >> (8 * (i % 4))) & 0xff) * d;
            }
#pragma unroll
            for (int t = 0; t < MM_TILE; t++) {
                if (t < nr) {
                    const float4* xb = (const float4*)(xr + t * k + b * 32);
                    float a = acc[t];
#pragma unroll
                    for (int i = 0; i < 8; i++) {
                        float4 v = xb[i];
                        a = fmaf(w[4 * i], v.x, a);
                        a = fmaf(w[4 * i + 1], v.y, a);
                        a = fmaf(w[4 * i + 2], v.z, a);
                        a = fmaf(w[4 * i + 3], v.w, a);
                    }
                    acc[t] = a;
                }
            }
        }
#pragma unroll
        for (int t = 0; t < MM_TILE; t++) {
            float s = warp_sum(acc[t]);
            if (lane == 0 && t < nr) y[(r0 + t) * n + j] = s;
        }
    }
}

extern "C" __global__ void matmul_q4_1(float* y, const float* x, u64 rows, const u32* dm,
                                       const u8* quants, u64 n, u64 k) {
    matmul_block<1>(y, x, rows, dm, quants, n, k);
}

extern "C" __global__ void matmul_q8_0(float* y, const float* x, u64 rows, const u32* dm,
                                       const u8* quants, u64 n, u64 k) {
    matmul_block<0>(y, x, rows, dm, quants, n, k);
}
