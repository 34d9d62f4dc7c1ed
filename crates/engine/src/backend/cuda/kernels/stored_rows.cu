// F16 / BF16 stored products of many rows (prefill chunks; `stored.rs`
// `matmul` from ROWS_FROM rows): a block owns 32 outputs × 32 rows and
// walks k in chunks of 64 values staged in shared memory; each thread
// keeps 4 outputs × 8 rows of one lane slot in registers, so a staged
// weight feeds 8 FMAs and a staged activation 4 (the tile kernels of
// `stored.cu` issue a shared-memory load per FMA: run 36's 256-row
// DeepSeek-V4 chunk spent 35 % of its time in them).
//
// The sums are the other kernels' (`st_pass` with `StF16` / `StBF16`: a
// unit is 8 values, lane slot l adds value 8u + l of every unit u in order
// from 0 with one FMA each; the 8 slots then meet in `group8_sum`'s
// butterfly, and slot 0 adds the values past the last whole unit). Here
// slot l is again threadIdx.x & 7 of a group of 8 threads, adding the same
// values in the same order, and the groups meet in the same butterfly, so
// every output has those kernels' bits. Only whole chunks: `stored.rs`
// takes this kernel where k is a multiple of 64 (so no tail).
#ifndef ST_HOST

#define SR_OUTS 32   // outputs a block
#define SR_ROWS 32   // rows a block
#define SR_KC 64     // values a chunk (8 units)
#define SR_J 4       // outputs a thread
#define SR_T 8       // rows a thread
// Floats between two lane slots of a staged activation row: 8 units and 4
// of padding, so the 8 slots' 16-byte loads fall on distinct banks.
#define SR_XL 12

template <int BF>
__device__ __forceinline__ float sr_w(u32 h) {
    return BF ? __uint_as_float(h << 16) : h2f((u16)h);
}

template <int BF>
__device__ __forceinline__ void st_rows(float* y, const float* x, u64 rows, const u8* w, u64 n,
                                        u64 k) {
    // ws[j][l][u]: value 8u + l of the chunk for output j (16-bit codes);
    // xs[t][l][u]: the same for activation row t.
    __shared__ __align__(16) u16 ws[SR_OUTS][8][8];
    __shared__ __align__(16) float xs[SR_ROWS][8][SR_XL];
    u32 tid = threadIdx.x, l = tid & 7, grp = tid >> 3;
    // Group grp: outputs (grp % 8)·4 .., rows (grp / 8)·8 .. of the tile.
    u32 jg = (grp % 8) * SR_J, tg = (grp / 8) * SR_T;
    u64 j0 = (u64)blockIdx.x * SR_OUTS, r0 = (u64)blockIdx.y * SR_ROWS;
    float acc[SR_J][SR_T];
#pragma unroll
    for (int a = 0; a < SR_J; a++)
#pragma unroll
        for (int b = 0; b < SR_T; b++) acc[a][b] = 0.0f;
    // The staging: thread tid loads 8 weights (output tid / 8, unit tid %
    // 8) and 8 activations (row tid / 8, unit tid % 8); rows past the
    // matrix or the activations read the last one (never stored).
    u64 wj = j0 + tid / 8 < n ? j0 + tid / 8 : n - 1;
    u64 xt = r0 + tid / 8 < rows ? r0 + tid / 8 : rows - 1;
    u32 su = tid % 8, sr = tid / 8;
    const u16* wrow = (const u16*)(w + wj * 2 * k);
    const float* xrow = x + xt * k;
    for (u64 c0 = 0; c0 < k; c0 += SR_KC) {
        uint4 wv = *(const uint4*)(wrow + c0 + 8 * su);
        float4 x0 = *(const float4*)(xrow + c0 + 8 * su);
        float4 x1 = *(const float4*)(xrow + c0 + 8 * su + 4);
        __syncthreads();  // every thread is done with the previous chunk
        u32 wh[4] = {wv.x, wv.y, wv.z, wv.w};
#pragma unroll
        for (int i = 0; i < 4; i++) {
            ws[sr][2 * i][su] = (u16)(wh[i] & 0xffff);
            ws[sr][2 * i + 1][su] = (u16)(wh[i] >> 16);
        }
        float xv[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
#pragma unroll
        for (int i = 0; i < 8; i++) xs[sr][i][su] = xv[i];
        __syncthreads();
#pragma unroll
        for (int h = 0; h < 2; h++) {  // units 4h .. 4h + 3
            float wf[SR_J][4];
#pragma unroll
            for (int a = 0; a < SR_J; a++) {
                uint2 p = *(const uint2*)&ws[jg + a][l][4 * h];
                wf[a][0] = sr_w<BF>(p.x & 0xffff);
                wf[a][1] = sr_w<BF>(p.x >> 16);
                wf[a][2] = sr_w<BF>(p.y & 0xffff);
                wf[a][3] = sr_w<BF>(p.y >> 16);
            }
#pragma unroll
            for (int b = 0; b < SR_T; b++) {
                float4 xv4 = *(const float4*)&xs[tg + b][l][4 * h];
                float xq[4] = {xv4.x, xv4.y, xv4.z, xv4.w};
#pragma unroll
                for (int u = 0; u < 4; u++)
#pragma unroll
                    for (int a = 0; a < SR_J; a++) acc[a][b] = fmaf(wf[a][u], xq[u], acc[a][b]);
            }
        }
    }
    unsigned mask = group_mask();
#pragma unroll
    for (int a = 0; a < SR_J; a++)
#pragma unroll
        for (int b = 0; b < SR_T; b++) {
            float s = group8_sum(acc[a][b], mask);
            u64 j = j0 + jg + a, t = r0 + tg + b;
            if (l == 0 && j < n && t < rows) y[t * n + j] = s;
        }
}

extern "C" __global__ void st_rows_f16(float* y, const float* x, u64 rows, const u8* w, u64 n,
                                       u64 k) {
    dep_entry();
    st_rows<0>(y, x, rows, w, n, k);
}
extern "C" __global__ void st_rows_bf16(float* y, const float* x, u64 rows, const u8* w, u64 n,
                                        u64 k) {
    dep_entry();
    st_rows<1>(y, x, rows, w, n, k);
}

#endif  // ST_HOST
