// Shared helpers of the ds4 CUDA kernels. Compiled by NVRTC with
// --fmad=false: no multiply-add is contracted behind our back, so every
// `a * b + c` rounds twice (as the CPU reference's scalar code does) and
// every fused multiply-add is an explicit fmaf. Reductions run in one order
// per kernel that depends on the reduction length only (never on the number
// of rows, the grid or the SM count): the exactness contract of
// `backend/mod.rs`.

typedef unsigned int u32;
typedef unsigned short u16;
typedef unsigned char u8;
typedef unsigned long long u64;

#define DS4_NEG_INF __int_as_float(0xff800000)
#define FULL_MASK 0xffffffffu

// f16 bits to f32 (exact), without cuda_fp16.h (NVRTC has no headers).
__device__ __forceinline__ float h2f(u16 h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}

// A butterfly over the 32 lanes: every lane ends with the same bits (IEEE
// addition is commutative), the tree is fixed.
__device__ __forceinline__ float warp_sum(float v) {
    v += __shfl_xor_sync(FULL_MASK, v, 16);
    v += __shfl_xor_sync(FULL_MASK, v, 8);
    v += __shfl_xor_sync(FULL_MASK, v, 4);
    v += __shfl_xor_sync(FULL_MASK, v, 2);
    v += __shfl_xor_sync(FULL_MASK, v, 1);
    return v;
}

// Max is exact whatever the order; fmaxf ignores a NaN operand like Rust's
// f32::max.
__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(FULL_MASK, v, o));
    return v;
}

// f32 to an unsigned key whose order is Rust's `f32::total_cmp` (−NaN <
// −∞ < … < −0 < +0 < … < +∞ < +NaN).
__device__ __forceinline__ u32 total_key(float f) {
    u32 b = __float_as_uint(f);
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

// `a` ranks before `b` in a top-k: larger first, ties to the lower index.
__device__ __forceinline__ bool ranks_before(u32 ka, u32 ia, u32 kb, u32 ib) {
    return ka > kb || (ka == kb && ia < ib);
}

__device__ __forceinline__ float sigmoid_f(float x) { return 1.0f / (1.0f + expf(-x)); }

// A grid-stride loop over `n` elements.
#define FOR_EACH(i, n) \
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < (u64)(n); \
         i += (u64)gridDim.x * blockDim.x)

// float4 loads of a run of values need both starts on 16 bytes.
__device__ __forceinline__ bool aligned16(const float* a, const float* b) {
    return (((unsigned long long)a | (unsigned long long)b) & 15) == 0;
}
// float4s of each side a dot loads ahead (`dot8_attn`, `dot_seq`). The two
// dots keep their own copy of the load-ahead loop: one helper taking the
// accumulation as a lambda kept every bit but decoded 3.5% slower
// (`docs/gpu-logs/16-review-dot-helper-ab.log`: 78.3–78.7 against
// 81.3 tok/s, the captured lane sums no longer in registers).
#define DOT_AHEAD 8

// The CPU's 8-lane FMA dot of attention (`cpu::attention::dot`): lane l
// accumulates fma(a, b) over indices ≡ l (mod 8) below ⌊n/8⌋·8, the lanes
// are summed ((l0+l4)+(l1+l5))+((l2+l6)+(l3+l7)), then the tail by FMA.
__device__ __forceinline__ float dot8_attn(const float* a, const float* b, int n) {
    float l[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
    int n8 = n / 8 * 8;
    if (aligned16(a, b)) {
        // The same FMAs in the same order, with DOT_AHEAD × 4 values of
        // each side loaded (float4) before the first of them is used: a
        // lane scoring a key row it alone reads otherwise waits one memory
        // latency per element.
        const float4* a4 = (const float4*)a;
        const float4* b4 = (const float4*)b;
        int n4 = n8 / 4;
        for (int c = 0; c < n4; c += DOT_AHEAD) {
            float4 x[DOT_AHEAD], y[DOT_AHEAD];
#pragma unroll
            for (int t = 0; t < DOT_AHEAD; t++)
                if (c + t < n4) x[t] = a4[c + t], y[t] = b4[c + t];
#pragma unroll
            for (int t = 0; t < DOT_AHEAD; t++) {
                if (c + t < n4) {
                    int o = (t & 1) * 4;
                    l[o + 0] = fmaf(x[t].x, y[t].x, l[o + 0]);
                    l[o + 1] = fmaf(x[t].y, y[t].y, l[o + 1]);
                    l[o + 2] = fmaf(x[t].z, y[t].z, l[o + 2]);
                    l[o + 3] = fmaf(x[t].w, y[t].w, l[o + 3]);
                }
            }
        }
    } else {
        for (int c = 0; c < n8; c += 8) {
#pragma unroll
            for (int t = 0; t < 8; t++) l[t] = fmaf(a[c + t], b[c + t], l[t]);
        }
    }
    float s = ((l[0] + l[4]) + (l[1] + l[5])) + ((l[2] + l[6]) + (l[3] + l[7]));
    for (int e = n8; e < n; e++) s = fmaf(a[e], b[e], s);
    return s;
}

// A plain sequential dot `Σ a·b` (products rounded, then added in order
// from −0.0), as Rust's `.map(|(a, b)| a * b).sum::<f32>()`.
__device__ __forceinline__ float dot_seq(const float* a, const float* b, int n) {
    float s = -0.0f;
    int e = 0;
    if (aligned16(a, b)) {
        // As `dot8_attn`: DOT_AHEAD float4s of each side loaded before the
        // first product, then the products added one after another.
        const float4* a4 = (const float4*)a;
        const float4* b4 = (const float4*)b;
        int n4 = n / 4;
        for (int c = 0; c < n4; c += DOT_AHEAD) {
            float4 x[DOT_AHEAD], y[DOT_AHEAD];
#pragma unroll
            for (int t = 0; t < DOT_AHEAD; t++)
                if (c + t < n4) x[t] = a4[c + t], y[t] = b4[c + t];
#pragma unroll
            for (int t = 0; t < DOT_AHEAD; t++) {
                if (c + t < n4) {
                    s += x[t].x * y[t].x;
                    s += x[t].y * y[t].y;
                    s += x[t].z * y[t].z;
                    s += x[t].w * y[t].w;
                }
            }
        }
        e = n4 * 4;
    }
    for (; e < n; e++) s += a[e] * b[e];
    return s;
}

// Programmatic dependent launch (sm_90 and later; `Device::launch_raw`
// sets the launch attribute): a kernel may be launched while the one
// before it on the stream still runs. Every kernel begins with
// `dep_entry()`, before it reads or writes anything: its wait returns when
// the kernel before has completed and its memory is visible, and since
// that kernel waited on its own predecessor the same holds down the
// stream. So no value any kernel reads or writes changes; only the next
// kernel's launch overlaps the kernel before (decode 1.12×, run 19,
// `docs/GPU.md`). A kernel lets its dependent launch only after its own
// wait: released at entry instead, a kernel two ahead could launch and
// hold SM slots while waiting (prefill 368 against 374 tok/s). Products
// prefetching their weights into L2 before the wait gained nothing (run
// 19). `Device::open` refuses a kernel set in which a kernel does not
// begin with the entry (`signature::check_waits`). Without the launch
// attribute (older GPUs, `DS4_CUDA_PDL=0`) both instructions are no-ops.
__device__ __forceinline__ void dep_entry() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Ask L2 for the 128-byte lines of [p, p + bytes), thread t of nt taking
// every nt-th line (lines start at the one holding p, so every line asked
// for holds bytes of the range). A hint: it reads nothing into registers.
__device__ __forceinline__ void prefetch_l2(const void* p, u64 bytes, u64 t, u64 nt) {
    u64 a = (u64)p, end = a + bytes;
    for (u64 l = (a & ~(u64)127) + t * 128; l < end; l += nt * 128)
        asm volatile("prefetch.global.L2 [%0];" ::"l"(l));
}
