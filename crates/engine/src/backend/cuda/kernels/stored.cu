// Stored weight types: products, routed products and row gathers for every
// type the CPU keeps stored (`CpuMatrix::Stored`: F16, BF16, Q4_0, Q5_0,
// Q5_1, Q2_K..Q6_K, Q8_K, IQ2_XXS, MXFP4, and FP8 E4M3 / FP4 E2M1 with a
// scale grid). The CPU's reference product dequantizes rows exactly
// (`quant::dequant`) and runs the f32 kernel over them; these kernels run
// that kernel's sequence per output element (`cpu::f32_matmul::dot`, as
// `matmul_f32` does): eight threads own an output, thread l accumulates
// fma(w[8c + l], x[8c + l], acc) over c in order, the eight sums are added
// ((a0+a4)+(a2+a6))+((a1+a5)+(a3+a7)), then the tail below 8 by FMA in
// order on thread 0. Each weight is dequantized in registers by its
// format's device function (`St*::lane` below), which computes the value
// `quant::dequant` computes, bit for bit: every definition there rounds
// once at most (an f16 scale times a few-bit integer is exact), so each is
// spelled with the same operations (an `fmaf` only where the product is
// exact, so the fused form rounds as the product-then-sum does). So a stored
// product has the CPU's bits, for every row count and window.
//
// The bytes stay as stored (every part joined, `cuda/stored.rs`). A block of
// 256 threads owns 32 weight rows and streams their bytes through shared
// memory a chunk at a time (whole format units, at most ST_CHUNK bytes of a
// row), ST_STAGES − 1 chunks in flight (cp.async), each row's chunk copied
// as the 16-byte words that cover it as they lie in memory (its first byte
// lands at its address mod 16), so no alignment is assumed of any format.
// The row loop is inside the kernels (activation rows ST_TILE at a time, the
// weights streamed once per tile), so one compiled code serves every row
// count.
//
// A format's unit is its block (32 or 256 values), or 8 values of the
// element types; `lane(b, l, v, …)` writes the LV = UV/8 values of lane l of
// the unit at b: element 8c + l of the unit into v[c]. `elem` is one value
// of a row (the element types' tails, below a multiple of 8).

#define ST_COLS 32
#define ST_TILE 4
#define ST_STAGES 3
#define ST_CHUNK 368
// Bytes a staged row takes (≥ ST_CHUNK + 30 rounded to 16): 100 words, so
// the four rows a warp reads start four banks apart.
#define ST_STRIDE 400

// A block's shape: the weight rows it owns, the bytes of a row a chunk
// stages, and a staged row's stride. `StWide` is the one above; `StNarrow`
// (the `st_matmul_narrow_*` kernels) owns 4 rows with chunks 8× longer, for
// products of few outputs: a block per 32 rows left most SMs idle and each
// block waiting on its short chunks (run 30's DeepSeek-V4 step: the F16
// hyper-connection and router products, 24–256 outputs over 4096–16384
// inputs, at 2–19 GB/s, half the step). The per-output sequence is the
// same, so the bits are.
// UNROLL: units whose activations a lane loads before it adds any of them
// (the same additions in the same order; a narrow block's lanes walk long
// rows, and one activation load per addition left them waiting on L2).
// XSTAGE: the activation rows' chunk is staged in shared memory beside the
// weights' (cp.async, in the same group), so the lanes' activation reads
// never wait on L2: run 31's profile of the narrow kernel with activations
// read from global memory (eight loads in flight a lane) had the HC `fn`
// product (24 × 16384) at 164 µs, 5 GB/s, its one computing warp a block
// waiting on every load. The sums are unchanged (same values, same order).
// STAGES: chunks in the ring (STAGES − 1 in flight); DYN: the ring is the
// launch's dynamic shared memory (`ST_DEEP_SMEM` bytes) instead of static.
struct StWide {
    enum {
        COLS = ST_COLS, CHUNK = ST_CHUNK, STRIDE = ST_STRIDE, UNROLL = 1, XSTAGE = 0,
        STAGES = ST_STAGES, DYN = 0
    };
};
// 3 stages × (4 weight rows of 1296 + 32 bytes + 4 activation rows of 648
// floats + 8): 47 KB of the 48 KB a block may hold statically.
struct StNarrow {
    enum {
        COLS = 4, CHUNK = 1296, STRIDE = 1296 + 32, UNROLL = 8, XSTAGE = 1, STAGES = ST_STAGES,
        DYN = 0
    };
};
// `StNarrow` with 8 stages in dynamic shared memory (7 chunks in flight,
// 124 KB; `cuda/stored.rs` `DEEP_SMEM`), where the device lets a block opt
// in to that much: run 31 had the narrow HC `fn` product at 48 µs for
// 786 KB, its lanes waiting on chunks with only 2 in flight. Same sums in
// the same order (only the ring is deeper).
struct StDeep {
    enum {
        COLS = 4, CHUNK = 1296, STRIDE = 1296 + 32, UNROLL = 8, XSTAGE = 1, STAGES = 8, DYN = 1
    };
};

// Scale grids (FP8 / FP4): value (r, c) is scaled by
// grid[rows[r] + c / bc]; `sh` = log2(bc) when bc is a power of two, else −1.
struct StScales {
    const float* grid;
    const u32* rows;
    u32 bc;
    int sh;
};

__device__ __forceinline__ u32 st_sidx(const StScales& sc, u32 col) {
    return sc.sh >= 0 ? col >> sc.sh : col / sc.bc;
}
__device__ __forceinline__ u32 st_u16(const u8* p) { return (u32)p[0] | ((u32)p[1] << 8); }
__device__ __forceinline__ u32 st_u32(const u8* p) { return st_u16(p) | (st_u16(p + 2) << 16); }
__device__ __forceinline__ float st_h(const u8* p) { return h2f((u16)st_u16(p)); }
// A small unsigned integer (< 2^23) as a float, exactly (2^23 + q − 2^23),
// without the int-to-float conversion's lower rate.
__device__ __forceinline__ float st_uf(u32 q) {
    return __uint_as_float(0x4B000000u | q) - 8388608.0f;
}
// A signed byte as a float, exactly (+0 for 0, as `i8 as f32`).
__device__ __forceinline__ float st_i8f(u32 b) { return st_uf((b & 0xffu) ^ 0x80u) - 128.0f; }

// ---- element types: a unit is 8 values.

struct StF16 {
    enum { UV = 8, UB = 16, LV = 1, SCALED = 0 };
    static __device__ __forceinline__ u64 row_bytes(u64 k) { return 2 * k; }
    // Rows and chunks start on even addresses (2 bytes a value).
    static __device__ __forceinline__ void lane(const u8* b, unsigned l, float (&v)[LV],
                                                const float*, u32, const StScales&) {
        v[0] = h2f(*(const u16*)(b + 2 * l));
    }
    static __device__ __forceinline__ float elem(const u8* row, u64 i, const float*,
                                                 const StScales&) {
        return h2f(*(const u16*)(row + 2 * i));
    }
};

struct StBF16 {
    enum { UV = 8, UB = 16, LV = 1, SCALED = 0 };
    static __device__ __forceinline__ u64 row_bytes(u64 k) { return 2 * k; }
    static __device__ __forceinline__ void lane(const u8* b, unsigned l, float (&v)[LV],
                                                const float*, u32, const StScales&) {
        v[0] = __uint_as_float((u32)(*(const u16*)(b + 2 * l)) << 16);
    }
    static __device__ __forceinline__ float elem(const u8* row, u64 i, const float*,
                                                 const StScales&) {
        return __uint_as_float((u32)(*(const u16*)(row + 2 * i)) << 16);
    }
};

// E4M3 (`e4m3_to_f32`): the code's low seven bits placed as an f32's
// exponent and mantissa (bits 20..30) are the value times 2^-120, subnormals
// included, so one exact product by 2^120 gives it; S.1111.111 is NaN.
__device__ __forceinline__ float st_e4m3(u32 x) {
    u32 m = x & 0x7fu;
    if (m == 0x7fu) return __uint_as_float(0x7fc00000u);
    float f = __uint_as_float(m << 20) * __uint_as_float(0x7b800000u);
    return (x & 0x80u) ? -f : f;
}

// FP8 E4M3 with a scale grid: `e4m3 · scale[c / bc]`, one product.
struct StFp8 {
    enum { UV = 8, UB = 8, LV = 1, SCALED = 1 };
    static __device__ __forceinline__ u64 row_bytes(u64 k) { return k; }
    static __device__ __forceinline__ void lane(const u8* b, unsigned l, float (&v)[LV],
                                                const float* srow, u32 col0,
                                                const StScales& sc) {
        v[0] = st_e4m3(b[l]) * srow[st_sidx(sc, col0 + l)];
    }
    static __device__ __forceinline__ float elem(const u8* row, u64 i, const float* srow,
                                                 const StScales& sc) {
        return st_e4m3(row[i]) * srow[st_sidx(sc, (u32)i)];
    }
};

// E2M1 (the OCP MX table `E2M1`): magnitude codes 0, 1 are 0 and 0.5, codes
// 2..7 an exponent and one mantissa bit; bit 3 the sign (code 8 is −0).
__device__ __forceinline__ float st_e2m1(u32 c) {
    u32 m = c & 7u;
    float f = m < 2u ? st_uf(m) * 0.5f
                     : __uint_as_float((((m >> 1) + 126u) << 23) | ((m & 1u) << 22));
    return __uint_as_float(__float_as_uint(f) | ((c & 8u) << 28));
}

// FP4 E2M1 pairs with a scale grid: byte i holds elements 2i (low nibble)
// and 2i + 1, both scaled by scale[2i / bc] (as `dequant::scaled`).
struct StFp4 {
    enum { UV = 8, UB = 4, LV = 1, SCALED = 1 };
    static __device__ __forceinline__ u64 row_bytes(u64 k) { return k / 2; }
    static __device__ __forceinline__ void lane(const u8* b, unsigned l, float (&v)[LV],
                                                const float* srow, u32 col0,
                                                const StScales& sc) {
        u32 c = ((u32)b[l >> 1] >> (4 * (l & 1))) & 15u;
        v[0] = st_e2m1(c) * srow[st_sidx(sc, (col0 + l) & ~1u)];
    }
    static __device__ __forceinline__ float elem(const u8* row, u64 i, const float* srow,
                                                 const StScales& sc) {
        u32 c = ((u32)row[i >> 1] >> (4 * (u32)(i & 1))) & 15u;
        return st_e2m1(c) * srow[st_sidx(sc, (u32)i & ~1u)];
    }
};

// ---- GGML's 32-value blocks (`legacy.rs`). Lane l of a block reads
// elements l, 8 + l (low nibbles of bytes l and 8 + l) and 16 + l, 24 + l
// (their high nibbles).

__device__ __forceinline__ float st_e8m0_half(u32 e) {
    return __uint_as_float(e < 2u ? 0x00200000u << e : (e - 1u) << 23);
}
// `KVALUES_MXFP4[c] as f32`: 0, 1, 2, 3, 4, 6, 8, 12 and their negatives,
// code 8 +0 (an integer table).
__device__ __forceinline__ float st_kv_mxfp4(u32 c) {
    float f = st_uf((0xC8643210u >> (4 * (c & 7u))) & 15u);
    return (c & 8u) ? 0.0f - f : f;
}

struct StQ4_0 {
    enum { UV = 32, UB = 18, LV = 4, SCALED = 0 };
    static __device__ __forceinline__ u64 row_bytes(u64 k) { return k / 32 * 18; }
    static __device__ __forceinline__ void lane(const u8* b, unsigned l, float (&v)[LV],
                                                const float*, u32, const StScales&) {
        float d = st_h(b);
        u32 q0 = b[2 + l], q1 = b[10 + l];
        v[0] = (st_uf(q0 & 15u) - 8.0f) * d;
        v[1] = (st_uf(q1 & 15u) - 8.0f) * d;
        v[2] = (st_uf(q0 >> 4) - 8.0f) * d;
        v[3] = (st_uf(q1 >> 4) - 8.0f) * d;
    }
    static __device__ __forceinline__ float elem(const u8*, u64, const float*,
                                                 const StScales&) {
        return 0.0f;
    }
};

// Q5_0 / Q5_1: the fifth bit of element e is bit e of qh.
struct StQ5_0 {
    enum { UV = 32, UB = 22, LV = 4, SCALED = 0 };
    static __device__ __forceinline__ u64 row_bytes(u64 k) { return k / 32 * 22; }
    static __device__ __forceinline__ void lane(const u8* b, unsigned l, float (&v)[LV],
                                                const float*, u32, const StScales&) {
        float d = st_h(b);
        u32 qh = st_u32(b + 2), q0 = b[6 + l], q1 = b[14 + l];
        v[0] = (st_uf((q0 & 15u) | (((qh >> l) & 1u) << 4)) - 16.0f) * d;
        v[1] = (st_uf((q1 & 15u) | (((qh >> (8 + l)) & 1u) << 4)) - 16.0f) * d;
        v[2] = (st_uf((q0 >> 4) | (((qh >> (16 + l)) & 1u) << 4)) - 16.0f) * d;
        v[3] = (st_uf((q1 >> 4) | (((qh >> (24 + l)) & 1u) << 4)) - 16.0f) * d;
    }
    static __device__ __forceinline__ float elem(const u8*, u64, const float*,
                                                 const StScales&) {
        return 0.0f;
    }
};

// `q·d + m`: q·d is exact, so one fmaf rounds as the two operations do.
struct StQ5_1 {
    enum { UV = 32, UB = 24, LV = 4, SCALED = 0 };
    static __device__ __forceinline__ u64 row_bytes(u64 k) { return k / 32 * 24; }
    static __device__ __forceinline__ void lane(const u8* b, unsigned l, float (&v)[LV],
                                                const float*, u32, const StScales&) {
        float d = st_h(b), m = st_h(b + 2);
        u32 qh = st_u32(b + 4), q0 = b[8 + l], q1 = b[16 + l];
        v[0] = fmaf(st_uf((q0 & 15u) | (((qh >> l) & 1u) << 4)), d, m);
        v[1] = fmaf(st_uf((q1 & 15u) | (((qh >> (8 + l)) & 1u) << 4)), d, m);
        v[2] = fmaf(st_uf((q0 >> 4) | (((qh >> (16 + l)) & 1u) << 4)), d, m);
        v[3] = fmaf(st_uf((q1 >> 4) | (((qh >> (24 + l)) & 1u) << 4)), d, m);
    }
    static __device__ __forceinline__ float elem(const u8*, u64, const float*,
                                                 const StScales&) {
        return 0.0f;
    }
};

struct StMxfp4 {
    enum { UV = 32, UB = 17, LV = 4, SCALED = 0 };
    static __device__ __forceinline__ u64 row_bytes(u64 k) { return k / 32 * 17; }
    static __device__ __forceinline__ void lane(const u8* b, unsigned l, float (&v)[LV],
                                                const float*, u32, const StScales&) {
        float d = st_e8m0_half(b[0]);
        u32 q0 = b[1 + l], q1 = b[9 + l];
        v[0] = st_kv_mxfp4(q0 & 15u) * d;
        v[1] = st_kv_mxfp4(q1 & 15u) * d;
        v[2] = st_kv_mxfp4(q0 >> 4) * d;
        v[3] = st_kv_mxfp4(q1 >> 4) * d;
    }
    static __device__ __forceinline__ float elem(const u8*, u64, const float*,
                                                 const StScales&) {
        return 0.0f;
    }
};

// ---- K-quant super-blocks of 256 (`k_quants.rs`). Lane l takes element
// 8c + l, c = 0..31: of a 16-value sub-block s, c = 2s and 2s + 1 (sub-block
// offsets l and 8 + l); of a 32-value one, c = 4s .. 4s + 3 (offsets 8i + l).

// Q2_K: `dl·q − ml` with dl·q exact (fmaf, one rounding as the two).
struct StQ2_K {
    enum { UV = 256, UB = 84, LV = 32, SCALED = 0 };
    static __device__ __forceinline__ u64 row_bytes(u64 k) { return k / 256 * 84; }
    static __device__ __forceinline__ void lane(const u8* b, unsigned l, float (&v)[LV],
                                                const float*, u32, const StScales&) {
        const u8* qs = b + 16;
        float d = st_h(b + 80), dmin = st_h(b + 82);
#pragma unroll
        for (int s = 0; s < 16; s++) {
            u32 sc = b[s];
            float dl = d * st_uf(sc & 15u), ml = dmin * st_uf(sc >> 4);
            const u8* q = qs + 32 * (s >> 3) + 16 * (s & 1);
            u32 shift = 2 * ((s & 7) >> 1);
            v[2 * s] = fmaf(dl, st_uf(((u32)q[l] >> shift) & 3u), -ml);
            v[2 * s + 1] = fmaf(dl, st_uf(((u32)q[8 + l] >> shift) & 3u), -ml);
        }
    }
    static __device__ __forceinline__ float elem(const u8*, u64, const float*,
                                                 const StScales&) {
        return 0.0f;
    }
};

// Q3_K: `(d·(sc − 32))·q`, q = two bits − (4 unless the hmask bit is set).
struct StQ3_K {
    enum { UV = 256, UB = 110, LV = 32, SCALED = 0 };
    static __device__ __forceinline__ u64 row_bytes(u64 k) { return k / 256 * 110; }
    static __device__ __forceinline__ void lane(const u8* b, unsigned l, float (&v)[LV],
                                                const float*, u32, const StScales&) {
        const u8* qs = b + 32;
        const u8* sc = b + 96;
        float d = st_h(b + 108);
#pragma unroll
        for (int s = 0; s < 16; s++) {
            u32 low = s < 8 ? sc[s] & 15u : (u32)sc[s - 8] >> 4;
            u32 high = ((u32)sc[8 + (s & 3)] >> (2 * (s >> 2))) & 3u;
            float dl = d * (st_uf(low | (high << 4)) - 32.0f);
            const u8* q = qs + 32 * (s >> 3) + 16 * (s & 1);
            const u8* hm = b + 16 * (s & 1);
            u32 shift = 2 * ((s & 7) >> 1);
            u32 m = 1u << ((s >> 3) * 4 + ((s & 7) >> 1));
#pragma unroll
            for (int h = 0; h < 2; h++) {
                u32 i = 8 * h + l;
                float qf = st_uf(((u32)q[i] >> shift) & 3u) - ((hm[i] & m) ? 0.0f : 4.0f);
                v[2 * s + h] = dl * qf;
            }
        }
    }
    static __device__ __forceinline__ float elem(const u8*, u64, const float*,
                                                 const StScales&) {
        return 0.0f;
    }
};

// Q4_K / Q5_K's 6-bit scale and min of sub-block j (`get_scale_min_k4`).
__device__ __forceinline__ void st_scale_min_k4(int j, const u8* q, u32& sc, u32& m) {
    if (j < 4) {
        sc = q[j] & 63u;
        m = q[j + 4] & 63u;
    } else {
        sc = (q[j + 4] & 15u) | (((u32)q[j - 4] >> 6) << 4);
        m = ((u32)q[j + 4] >> 4) | (((u32)q[j] >> 6) << 4);
    }
}

// Q4_K: `d1·q − m1`, d1·q exact (fmaf).
struct StQ4_K {
    enum { UV = 256, UB = 144, LV = 32, SCALED = 0 };
    static __device__ __forceinline__ u64 row_bytes(u64 k) { return k / 256 * 144; }
    static __device__ __forceinline__ void lane(const u8* b, unsigned l, float (&v)[LV],
                                                const float*, u32, const StScales&) {
        float d = st_h(b), dmin = st_h(b + 2);
#pragma unroll
        for (int s = 0; s < 8; s++) {
            u32 sc, mn;
            st_scale_min_k4(s, b + 4, sc, mn);
            float d1 = d * st_uf(sc), m1 = dmin * st_uf(mn);
            const u8* q = b + 16 + 32 * (s >> 1);
            u32 shift = 4 * (s & 1);
#pragma unroll
            for (int i = 0; i < 4; i++)
                v[4 * s + i] = fmaf(d1, st_uf(((u32)q[8 * i + l] >> shift) & 15u), -m1);
        }
    }
    static __device__ __forceinline__ float elem(const u8*, u64, const float*,
                                                 const StScales&) {
        return 0.0f;
    }
};

// Q5_K: Q4_K plus a fifth bit, bit s of qh[i] for sub-block s.
struct StQ5_K {
    enum { UV = 256, UB = 176, LV = 32, SCALED = 0 };
    static __device__ __forceinline__ u64 row_bytes(u64 k) { return k / 256 * 176; }
    static __device__ __forceinline__ void lane(const u8* b, unsigned l, float (&v)[LV],
                                                const float*, u32, const StScales&) {
        float d = st_h(b), dmin = st_h(b + 2);
        const u8* qh = b + 16;
#pragma unroll
        for (int s = 0; s < 8; s++) {
            u32 sc, mn;
            st_scale_min_k4(s, b + 4, sc, mn);
            float d1 = d * st_uf(sc), m1 = dmin * st_uf(mn);
            const u8* q = b + 48 + 32 * (s >> 1);
            u32 shift = 4 * (s & 1);
#pragma unroll
            for (int i = 0; i < 4; i++) {
                u32 e = 8 * i + l;
                u32 qv = (((u32)q[e] >> shift) & 15u) | ((((u32)qh[e] >> s) & 1u) << 4);
                v[4 * s + i] = fmaf(d1, st_uf(qv), -m1);
            }
        }
    }
    static __device__ __forceinline__ float elem(const u8*, u64, const float*,
                                                 const StScales&) {
        return 0.0f;
    }
};

// Q6_K: `(d·sc)·(q − 32)`, d·sc exact, the last product rounding (one
// product, in the reference's order).
struct StQ6_K {
    enum { UV = 256, UB = 210, LV = 32, SCALED = 0 };
    static __device__ __forceinline__ u64 row_bytes(u64 k) { return k / 256 * 210; }
    static __device__ __forceinline__ void lane(const u8* b, unsigned l, float (&v)[LV],
                                                const float*, u32, const StScales&) {
        float d = st_h(b + 208);
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const u8* ql = b + 64 * h;
            const u8* qh = b + 128 + 32 * h;
            const u8* sc = b + 192 + 8 * h;
#pragma unroll
            for (int t = 0; t < 4; t++) {
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    u32 lp = 8 * i + l;
                    u32 low = ((u32)ql[lp + 32 * (t & 1)] >> (4 * (t >> 1))) & 15u;
                    u32 high = ((u32)qh[lp] >> (2 * t)) & 3u;
                    float scale = st_i8f(sc[(lp >> 4) + 2 * t]);
                    v[16 * h + 4 * t + i] = (d * scale) * (st_uf(low | (high << 4)) - 32.0f);
                }
            }
        }
    }
    static __device__ __forceinline__ float elem(const u8*, u64, const float*,
                                                 const StScales&) {
        return 0.0f;
    }
};

// Q8_K: an f32 scale times the signed byte.
struct StQ8_K {
    enum { UV = 256, UB = 292, LV = 32, SCALED = 0 };
    static __device__ __forceinline__ u64 row_bytes(u64 k) { return k / 256 * 292; }
    static __device__ __forceinline__ void lane(const u8* b, unsigned l, float (&v)[LV],
                                                const float*, u32, const StScales&) {
        float d = __uint_as_float(st_u32(b));
#pragma unroll
        for (int c = 0; c < 32; c++) v[c] = d * st_i8f(b[4 + 8 * c + l]);
    }
    static __device__ __forceinline__ float elem(const u8*, u64, const float*,
                                                 const StScales&) {
        return 0.0f;
    }
};

// IQ2_XXS: 8 groups of 32, each two words: four grid indices, and four
// 7-bit sign patterns plus a 4-bit scale; `db = (d·(0.5 + s))·0.25`, value
// `(db·grid[j])·±1`. Lane l takes byte l of each 8-value grid row and sign
// bit l. Tables from `quant/dequant/iq2.rs` (ggml's `iq2xxs_grid`,
// `ksigns_iq2xs`), in global memory rather than constant memory: lanes
// read them at different indices, which constant memory serializes
// (`kq8.cu`'s tables copy).
__device__ u64 st_iq2xxs_grid[256] = {
    0x0808080808080808ull, 0x080808080808082bull, 0x0808080808081919ull, 0x0808080808082b08ull,
    0x0808080808082b2bull, 0x0808080808190819ull, 0x0808080808191908ull, 0x08080808082b0808ull,
    0x08080808082b082bull, 0x08080808082b2b08ull, 0x08080808082b2b2bull, 0x0808080819080819ull,
    0x0808080819081908ull, 0x0808080819190808ull, 0x0808080819192b08ull, 0x08080808192b0819ull,
    0x08080808192b1908ull, 0x080808082b080808ull, 0x080808082b08082bull, 0x080808082b082b2bull,
    0x080808082b2b082bull, 0x0808081908080819ull, 0x0808081908081908ull, 0x0808081908190808ull,
    0x0808081908191919ull, 0x0808081919080808ull, 0x080808192b081908ull, 0x080808192b192b08ull,
    0x0808082b08080808ull, 0x0808082b0808082bull, 0x0808082b082b082bull, 0x0808082b2b08082bull,
    0x0808190808080819ull, 0x0808190808081908ull, 0x0808190808190808ull, 0x08081908082b0819ull,
    0x08081908082b1908ull, 0x0808190819080808ull, 0x080819081908082bull, 0x0808190819082b08ull,
    0x08081908192b0808ull, 0x080819082b080819ull, 0x080819082b081908ull, 0x080819082b190808ull,
    0x080819082b2b1908ull, 0x0808191908080808ull, 0x080819190808082bull, 0x0808191908082b08ull,
    0x08081919082b0808ull, 0x080819191908192bull, 0x08081919192b2b19ull, 0x080819192b080808ull,
    0x080819192b190819ull, 0x0808192b08082b19ull, 0x0808192b08190808ull, 0x0808192b19080808ull,
    0x0808192b2b081908ull, 0x0808192b2b2b1908ull, 0x08082b0808080808ull, 0x08082b0808081919ull,
    0x08082b0808082b08ull, 0x08082b0808191908ull, 0x08082b08082b2b08ull, 0x08082b0819080819ull,
    0x08082b0819081908ull, 0x08082b0819190808ull, 0x08082b081919082bull, 0x08082b082b082b08ull,
    0x08082b1908081908ull, 0x08082b1919080808ull, 0x08082b2b0808082bull, 0x08082b2b08191908ull,
    0x0819080808080819ull, 0x0819080808081908ull, 0x0819080808190808ull, 0x08190808082b0819ull,
    0x0819080819080808ull, 0x08190808192b0808ull, 0x081908082b081908ull, 0x081908082b190808ull,
    0x081908082b191919ull, 0x0819081908080808ull, 0x0819081908082b08ull, 0x08190819082b0808ull,
    0x0819081919190808ull, 0x0819081919192b2bull, 0x081908192b080808ull, 0x0819082b082b1908ull,
    0x0819082b19081919ull, 0x0819190808080808ull, 0x0819190808082b08ull, 0x08191908082b0808ull,
    0x08191908082b1919ull, 0x0819190819082b19ull, 0x081919082b080808ull, 0x0819191908192b08ull,
    0x08191919192b082bull, 0x0819192b08080808ull, 0x0819192b0819192bull, 0x08192b0808080819ull,
    0x08192b0808081908ull, 0x08192b0808190808ull, 0x08192b0819080808ull, 0x08192b082b080819ull,
    0x08192b1908080808ull, 0x08192b1908081919ull, 0x08192b192b2b0808ull, 0x08192b2b19190819ull,
    0x082b080808080808ull, 0x082b08080808082bull, 0x082b080808082b2bull, 0x082b080819081908ull,
    0x082b0808192b0819ull, 0x082b08082b080808ull, 0x082b08082b08082bull, 0x082b0819082b2b19ull,
    0x082b081919082b08ull, 0x082b082b08080808ull, 0x082b082b0808082bull, 0x082b190808080819ull,
    0x082b190808081908ull, 0x082b190808190808ull, 0x082b190819080808ull, 0x082b19081919192bull,
    0x082b191908080808ull, 0x082b191919080819ull, 0x082b1919192b1908ull, 0x082b192b2b190808ull,
    0x082b2b0808082b08ull, 0x082b2b08082b0808ull, 0x082b2b082b191908ull, 0x082b2b2b19081908ull,
    0x1908080808080819ull, 0x1908080808081908ull, 0x1908080808190808ull, 0x1908080808192b08ull,
    0x19080808082b0819ull, 0x19080808082b1908ull, 0x1908080819080808ull, 0x1908080819082b08ull,
    0x190808081919192bull, 0x19080808192b0808ull, 0x190808082b080819ull, 0x190808082b081908ull,
    0x190808082b190808ull, 0x1908081908080808ull, 0x19080819082b0808ull, 0x19080819192b0819ull,
    0x190808192b080808ull, 0x190808192b081919ull, 0x1908082b08080819ull, 0x1908082b08190808ull,
    0x1908082b19082b08ull, 0x1908082b1919192bull, 0x1908082b192b2b08ull, 0x1908190808080808ull,
    0x1908190808082b08ull, 0x19081908082b0808ull, 0x190819082b080808ull, 0x190819082b192b19ull,
    0x190819190819082bull, 0x19081919082b1908ull, 0x1908192b08080808ull, 0x19082b0808080819ull,
    0x19082b0808081908ull, 0x19082b0808190808ull, 0x19082b0819080808ull, 0x19082b0819081919ull,
    0x19082b1908080808ull, 0x19082b1919192b08ull, 0x19082b19192b0819ull, 0x19082b192b08082bull,
    0x19082b2b19081919ull, 0x19082b2b2b190808ull, 0x1919080808080808ull, 0x1919080808082b08ull,
    0x1919080808190819ull, 0x1919080808192b19ull, 0x19190808082b0808ull, 0x191908082b080808ull,
    0x191908082b082b08ull, 0x1919081908081908ull, 0x191908191908082bull, 0x191908192b2b1908ull,
    0x1919082b2b190819ull, 0x191919082b190808ull, 0x191919082b19082bull, 0x1919191908082b2bull,
    0x1919192b08080819ull, 0x1919192b19191908ull, 0x19192b0808080808ull, 0x19192b0808190819ull,
    0x19192b0808192b19ull, 0x19192b08192b1908ull, 0x19192b1919080808ull, 0x19192b2b08082b08ull,
    0x192b080808081908ull, 0x192b080808190808ull, 0x192b080819080808ull, 0x192b0808192b2b08ull,
    0x192b081908080808ull, 0x192b081919191919ull, 0x192b082b08192b08ull, 0x192b082b192b0808ull,
    0x192b190808080808ull, 0x192b190808081919ull, 0x192b191908190808ull, 0x192b19190819082bull,
    0x192b19192b081908ull, 0x192b2b081908082bull, 0x2b08080808080808ull, 0x2b0808080808082bull,
    0x2b08080808082b2bull, 0x2b08080819080819ull, 0x2b0808082b08082bull, 0x2b08081908081908ull,
    0x2b08081908192b08ull, 0x2b08081919080808ull, 0x2b08082b08190819ull, 0x2b08190808080819ull,
    0x2b08190808081908ull, 0x2b08190808190808ull, 0x2b08190808191919ull, 0x2b08190819080808ull,
    0x2b081908192b0808ull, 0x2b08191908080808ull, 0x2b0819191908192bull, 0x2b0819192b191908ull,
    0x2b08192b08082b19ull, 0x2b08192b19080808ull, 0x2b08192b192b0808ull, 0x2b082b080808082bull,
    0x2b082b1908081908ull, 0x2b082b2b08190819ull, 0x2b19080808081908ull, 0x2b19080808190808ull,
    0x2b190808082b1908ull, 0x2b19080819080808ull, 0x2b1908082b2b0819ull, 0x2b1908190819192bull,
    0x2b1908192b080808ull, 0x2b19082b19081919ull, 0x2b19190808080808ull, 0x2b191908082b082bull,
    0x2b19190819081908ull, 0x2b19191919190819ull, 0x2b192b082b080819ull, 0x2b192b19082b0808ull,
    0x2b2b08080808082bull, 0x2b2b080819190808ull, 0x2b2b08082b081919ull, 0x2b2b081908082b19ull,
    0x2b2b082b08080808ull, 0x2b2b190808192b08ull, 0x2b2b2b0819190808ull, 0x2b2b2b1908081908ull,
};
__device__ u8 st_ksigns_iq2xs[128] = {
    0, 129, 130, 3, 132, 5, 6, 135, 136, 9, 10, 139, 12, 141, 142, 15,
    144, 17, 18, 147, 20, 149, 150, 23, 24, 153, 154, 27, 156, 29, 30, 159,
    160, 33, 34, 163, 36, 165, 166, 39, 40, 169, 170, 43, 172, 45, 46, 175,
    48, 177, 178, 51, 180, 53, 54, 183, 184, 57, 58, 187, 60, 189, 190, 63,
    192, 65, 66, 195, 68, 197, 198, 71, 72, 201, 202, 75, 204, 77, 78, 207,
    80, 209, 210, 83, 212, 85, 86, 215, 216, 89, 90, 219, 92, 221, 222, 95,
    96, 225, 226, 99, 228, 101, 102, 231, 232, 105, 106, 235, 108, 237, 238, 111,
    240, 113, 114, 243, 116, 245, 246, 119, 120, 249, 250, 123, 252, 125, 126, 255,
};

struct StIq2xxs {
    enum { UV = 256, UB = 66, LV = 32, SCALED = 0 };
    static __device__ __forceinline__ u64 row_bytes(u64 k) { return k / 256 * 66; }
    static __device__ __forceinline__ void lane(const u8* b, unsigned l, float (&v)[LV],
                                                const float*, u32, const StScales&) {
        float d = st_h(b);
#pragma unroll
        for (int g = 0; g < 8; g++) {
            const u8* gp = b + 2 + 8 * g;
            u32 aux1 = st_u32(gp + 4);
            float db = (d * (0.5f + st_uf(aux1 >> 28))) * 0.25f;
#pragma unroll
            for (int j = 0; j < 4; j++) {
                u64 grid = st_iq2xxs_grid[gp[j]];
                u32 signs = st_ksigns_iq2xs[(aux1 >> (7 * j)) & 127u];
                float gv = st_uf((u32)(grid >> (8 * l)) & 0xffu);
                v[4 * g + j] = (db * gv) * (((signs >> l) & 1u) ? -1.0f : 1.0f);
            }
        }
    }
    static __device__ __forceinline__ float elem(const u8*, u64, const float*,
                                                 const StScales&) {
        return 0.0f;
    }
};

// ---- the chunk pipeline

// Units per chunk, bytes of a row's chunk, and the 16-byte words that cover
// it wherever it starts.
template <class F, int CHUNK = ST_CHUNK>
struct StGeo {
    enum {
        UPC = CHUNK / F::UB,
        CB = (CHUNK / F::UB) * F::UB,
        WMAX = (CB + 30) / 16,
    };
};

__device__ __forceinline__ u64 st_min(u64 a, u64 b) { return a < b ? a : b; }

#ifndef ST_HOST
// An asynchronous 16-byte copy, global to shared (sm_80 and later).
__device__ __forceinline__ void st_cp16(u8* smem, const u8* gmem) {
    u32 s = (u32)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(s), "l"(gmem) : "memory");
}
__device__ __forceinline__ void st_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void st_wait() {
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}
#endif

// Thread t of nt copies its share of chunk `u0 .. u0 + cnt` (units) of rows
// wrow0 .. wrow0 + valid into `stage` (row r at r·ST_STRIDE): the aligned
// words of [a & ~15, a + cnt·UB), a the address of the chunk's first byte
// in the row (the kernels need no alignment of the weight buffer).
template <class F, class B = StWide>
__device__ __forceinline__ void st_issue(u8* stage, const u8* w, u64 rb, u64 wrow0, u32 valid,
                                         u64 u0, u64 cnt, u32 t, u32 nt) {
    const u32 wmax = StGeo<F, B::CHUNK>::WMAX;
    for (u32 i = t; i < B::COLS * wmax; i += nt) {
        u32 r = i / wmax, wd = i % wmax;
        if (r >= valid) break;
        u64 s = (u64)(w + (wrow0 + r) * rb + u0 * F::UB);
        u64 a = (s & ~(u64)15) + 16 * (u64)wd;
        if (a < s + cnt * F::UB) st_cp16(stage + r * B::STRIDE + 16 * wd, (const u8*)a);
    }
}

// acc[t] (t < nr) += lane l's share of the staged chunk (`row`: this
// thread's row of the stage; `g`: the chunk's first byte in memory, which
// landed at offset g mod 16) against activation rows xr + t·k, units in
// order, a unit's values in order.
template <class F, int T, int U = 1>
__device__ __forceinline__ void st_compute(float (&acc)[T], u64 nr, const float* xr, u64 k,
                                           const u8* row, const u8* g, u64 u0, u64 cnt,
                                           unsigned l, const float* srow, const StScales& sc) {
    const u8* base = row + ((u64)g & 15);
    u64 u = 0;
    if (U > 1) {
        for (; u + U <= cnt; u += U) {
            float xv[U][F::LV][T];
#pragma unroll
            for (int q = 0; q < U; q++) {
                u32 col0 = (u32)((u0 + u + q) * F::UV);
#pragma unroll
                for (int i = 0; i < F::LV; i++)
#pragma unroll
                    for (int t = 0; t < T; t++)
                        xv[q][i][t] = (u64)t < nr ? xr[t * k + col0 + 8 * i + l] : 0.0f;
            }
#pragma unroll
            for (int q = 0; q < U; q++) {
                float v[F::LV];
                u32 col0 = (u32)((u0 + u + q) * F::UV);
                F::lane(base + (u + q) * F::UB, l, v, srow, col0, sc);
#pragma unroll
                for (int i = 0; i < F::LV; i++)
#pragma unroll
                    for (int t = 0; t < T; t++)
                        if ((u64)t < nr) acc[t] = fmaf(v[i], xv[q][i][t], acc[t]);
            }
        }
    }
    for (; u < cnt; u++) {
        float v[F::LV];
        u32 col0 = (u32)((u0 + u) * F::UV);
        F::lane(base + u * F::UB, l, v, srow, col0, sc);
#pragma unroll
        for (int i = 0; i < F::LV; i++) {
            const float* xc = xr + col0 + 8 * i + l;
#pragma unroll
            for (int t = 0; t < T; t++)
                if ((u64)t < nr) acc[t] = fmaf(v[i], xc[t * k], acc[t]);
        }
    }
}

// Lane 0's tail after the lane sum: the values 8⌊k/8⌋ .. k in order.
template <class F>
__device__ __forceinline__ float st_tail(float s, const u8* wr, const float* xr, u64 k8, u64 k,
                                         const float* srow, const StScales& sc) {
    for (u64 i = k8; i < k; i++) s = fmaf(F::elem(wr, i, srow, sc), xr[i], s);
    return s;
}

// The scale row of weight row r (unused by self-contained formats).
template <class F>
__device__ __forceinline__ const float* st_srow(const StScales& sc, u64 r) {
    return F::SCALED ? sc.grid + sc.rows[r] : sc.grid;
}

// Floats a staged activation row holds: the chunk's values and the words
// that cover its unaligned start (a row of x starts at r·k floats).
template <class F, class B>
struct StXGeo {
    enum { VALS = StGeo<F, B::CHUNK>::UPC * F::UV, STRIDE = VALS + 8 };
};

// Issue the 16-byte copies of activation rows xr + t·k (t < nr), values
// u0·UV .. (u0 + cnt)·UV, into xs (row t at t·STRIDE, its first value at
// float offset (address mod 16) / 4).
template <class F, int T, class B>
__device__ __forceinline__ void st_issue_x(float* xs, const float* xr, u64 k, u64 nr, u64 u0,
                                           u64 cnt, u32 t0, u32 nt) {
    const u32 wmax = (StXGeo<F, B>::VALS * 4 + 30) / 16;
    for (u32 i = t0; i < T * wmax; i += nt) {
        u32 t = i / wmax, wd = i % wmax;
        if ((u64)t >= nr) break;
        u64 s = (u64)(xr + t * k + u0 * F::UV);
        u64 a = (s & ~(u64)15) + 16 * (u64)wd;
        if (a < s + cnt * F::UV * 4)
            st_cp16((u8*)(xs + t * StXGeo<F, B>::STRIDE) + 16 * wd, (const u8*)a);
    }
}

// `st_compute` with the activations read from their staged chunk `xs`
// (`st_issue_x`): the same values in the same order.
template <class F, int T, int U, class B>
__device__ __forceinline__ void st_compute_xs(float (&acc)[T], u64 nr, const float* xr, u64 k,
                                              const float* xs, const u8* row, const u8* g,
                                              u64 u0, u64 cnt, unsigned l, const float* srow,
                                              const StScales& sc) {
    const u8* base = row + ((u64)g & 15);
    const float* xt[T];
#pragma unroll
    for (int t = 0; t < T; t++)
        xt[t] = xs + t * StXGeo<F, B>::STRIDE + (((u64)(xr + t * k + u0 * F::UV) & 15) >> 2);
    u64 u = 0;
    for (; u + U <= cnt; u += U) {
        float xv[U][F::LV][T];
#pragma unroll
        for (int q = 0; q < U; q++)
#pragma unroll
            for (int i = 0; i < F::LV; i++)
#pragma unroll
                for (int t = 0; t < T; t++)
                    xv[q][i][t] = (u64)t < nr ? xt[t][(u + q) * F::UV + 8 * i + l] : 0.0f;
#pragma unroll
        for (int q = 0; q < U; q++) {
            float v[F::LV];
            u32 col0 = (u32)((u0 + u + q) * F::UV);
            F::lane(base + (u + q) * F::UB, l, v, srow, col0, sc);
#pragma unroll
            for (int i = 0; i < F::LV; i++)
#pragma unroll
                for (int t = 0; t < T; t++)
                    if ((u64)t < nr) acc[t] = fmaf(v[i], xv[q][i][t], acc[t]);
        }
    }
    for (; u < cnt; u++) {
        float v[F::LV];
        u32 col0 = (u32)((u0 + u) * F::UV);
        F::lane(base + u * F::UB, l, v, srow, col0, sc);
#pragma unroll
        for (int i = 0; i < F::LV; i++)
#pragma unroll
            for (int t = 0; t < T; t++)
                if ((u64)t < nr) acc[t] = fmaf(v[i], xt[t][u * F::UV + 8 * i + l], acc[t]);
    }
}

#ifndef ST_HOST
// The whole block: weight rows wrow0 + j (j = threadIdx.x / 8 < valid)
// against activation rows xr + t·k (t < nr), chunk by chunk through the
// ST_STAGES buffers of `buf`; lane sums in acc. Every thread of the block
// calls it (it waits at barriers).
template <class F, int T, class B = StWide>
__device__ __forceinline__ void st_pass(float (&acc)[T], u64 nr, const float* xr, u64 k,
                                        const u8* w, u64 wrow0, u32 valid, const StScales& sc,
                                        u8* buf, float* xbuf = nullptr) {
    const u64 upc = StGeo<F, B::CHUNK>::UPC;
    u64 units = k / F::UV, rb = F::row_bytes(k);
    u64 chunks = (units + upc - 1) / upc;
    unsigned col = threadIdx.x / 8, l = threadIdx.x & 7;
    bool live = col < valid;
    u64 wrow = wrow0 + col;
    const float* srow = live ? st_srow<F>(sc, wrow) : sc.grid;
    const u64 stage = (u64)B::COLS * B::STRIDE;
    const u64 xstage = (u64)T * StXGeo<F, B>::STRIDE;
    for (u64 c = 0; c + 1 < B::STAGES; c++) {
        if (c < chunks) {
            u64 cnt = st_min(upc, units - c * upc);
            st_issue<F, B>(buf + (c % B::STAGES) * stage, w, rb, wrow0, valid, c * upc, cnt,
                           threadIdx.x, blockDim.x);
            if (B::XSTAGE)
                st_issue_x<F, T, B>(xbuf + (c % B::STAGES) * xstage, xr, k, nr, c * upc, cnt,
                                    threadIdx.x, blockDim.x);
        }
        st_commit();
    }
    for (u64 c = 0; c < chunks; c++) {
        // Chunk c has landed (only the B::STAGES − 2 newer groups may be in
        // flight), for every thread's copies after the barrier; the buffer
        // refilled next held chunk c − 1, which every thread has finished.
        st_wait<B::STAGES - 2>();
        __syncthreads();
        u64 next = c + B::STAGES - 1;
        if (next < chunks) {
            u64 cnt = st_min(upc, units - next * upc);
            st_issue<F, B>(buf + (next % B::STAGES) * stage, w, rb, wrow0, valid, next * upc,
                           cnt, threadIdx.x, blockDim.x);
            if (B::XSTAGE)
                st_issue_x<F, T, B>(xbuf + (next % B::STAGES) * xstage, xr, k, nr, next * upc,
                                    cnt, threadIdx.x, blockDim.x);
        }
        st_commit();
        if (live) {
            u64 u0 = c * upc;
            if (B::XSTAGE)
                st_compute_xs<F, T, B::UNROLL, B>(
                    acc, nr, xr, k, xbuf + (c % B::STAGES) * xstage,
                    buf + (c % B::STAGES) * stage + col * B::STRIDE, w + wrow * rb + u0 * F::UB,
                    u0, st_min(upc, units - u0), l, srow, sc);
            else
                st_compute<F, T, B::UNROLL>(acc, nr, xr, k,
                                            buf + (c % B::STAGES) * stage + col * B::STRIDE,
                                            w + wrow * rb + u0 * F::UB, u0,
                                            st_min(upc, units - u0), l, srow, sc);
        }
    }
    st_wait<0>();
    __syncthreads();
}

// The rows of x in tiles of T through one block's weight rows (`st_matmul`);
// grid.y splits the tiles between blocks (a prefill chunk's narrow
// products: run 36's 256-row DeepSeek-V4 forward had the 24-output HC `fn`
// product's 6 blocks walking all 64 tiles, 3.3 ms a launch). Which block
// runs a tile changes no output's sequence.
template <class F, class B, int T>
__device__ __forceinline__ void st_matmul_tiles(float* y, const float* x, u64 rows, const u8* w,
                                                u64 n, u64 k, const StScales& sc, u8* buf,
                                                float* xbuf) {
    unsigned col = threadIdx.x / 8, l = threadIdx.x & 7, mask = group_mask();
    u64 k8 = k / F::UV * F::UV, rb = F::row_bytes(k);
    for (u64 j0 = (u64)blockIdx.x * B::COLS; j0 < n; j0 += (u64)gridDim.x * B::COLS) {
        u32 valid = (u32)st_min(B::COLS, n - j0);
        u64 j = j0 + col;
        for (u64 r0 = (u64)blockIdx.y * T; r0 < rows; r0 += (u64)gridDim.y * T) {
            u64 nr = st_min(T, rows - r0);
            const float* xr = x + r0 * k;
            float acc[T];
#pragma unroll
            for (int t = 0; t < T; t++) acc[t] = 0.f;
            st_pass<F, T, B>(acc, nr, xr, k, w, j0, valid, sc, buf, xbuf);
#pragma unroll
            for (int t = 0; t < T; t++) {
                float s = group8_sum(acc[t], mask);
                if (l == 0 && (u64)t < nr && col < valid) {
                    s = st_tail<F>(s, w + j * rb, xr + t * k, k8, k, st_srow<F>(sc, j), sc);
                    y[(r0 + t) * n + j] = s;
                }
            }
        }
    }
}

// y[r, j] = x[r] · w[j] for rows × n outputs (`Backend::matmul`).
// One row (a decode step's products) runs the tile loop with T = 1: the
// same sums in the same order as row 0 of a 4-row tile (each row's lane
// sums are independent of the other rows of its tile), without the three
// predicated-off loads and FMAs per value a 4-row tile issues for a lone
// row (run 32's step: these products on one row at 14–47 µs, 53–313 GB/s).
template <class F, class B = StWide>
__device__ __forceinline__ void st_matmul(float* y, const float* x, u64 rows, const u8* w, u64 n,
                                          u64 k, const StScales& sc) {
    __shared__ __align__(16) u8 sbuf[B::DYN ? 16 : B::STAGES * B::COLS * B::STRIDE];
    __shared__ __align__(16) float sxbuf[B::XSTAGE && !B::DYN ? B::STAGES * ST_TILE * StXGeo<F, B>::STRIDE : 4];
    extern __shared__ __align__(16) u8 st_dyn[];
    u8* buf = B::DYN ? st_dyn : sbuf;
    float* xbuf = B::DYN ? (float*)(st_dyn + B::STAGES * B::COLS * B::STRIDE) : sxbuf;
    if (rows == 1)
        st_matmul_tiles<F, B, 1>(y, x, rows, w, n, k, sc, buf, xbuf);
    else
        st_matmul_tiles<F, B, ST_TILE>(y, x, rows, w, n, k, sc, buf, xbuf);
}

// Routed products: pair p multiplies x row p / x_div by expert experts[p]
// of the stack [E, n, k] (weight rows experts[p]·n + j); y: [pairs, n].
// Each output is `st_matmul`'s sequence, so a routed projection has the
// bits of a `matmul` by that expert's matrix.
template <class F>
__device__ __forceinline__ void st_gather(float* y, const float* x, u64 x_div,
                                          const u32* experts, u64 pairs, const u8* w, u64 n,
                                          u64 k, const StScales& sc) {
    __shared__ __align__(16) u8 buf[ST_STAGES * ST_COLS * ST_STRIDE];
    unsigned col = threadIdx.x / 8, l = threadIdx.x & 7, mask = group_mask();
    u64 k8 = k / F::UV * F::UV, rb = F::row_bytes(k);
    for (u64 p = blockIdx.y; p < pairs; p += gridDim.y) {
        u64 e = experts[p];
        const float* xr = x + (p / x_div) * k;
        for (u64 j0 = (u64)blockIdx.x * ST_COLS; j0 < n; j0 += (u64)gridDim.x * ST_COLS) {
            u32 valid = (u32)st_min(ST_COLS, n - j0);
            float acc[1] = {0.f};
            st_pass<F, 1>(acc, 1, xr, k, w, e * n + j0, valid, sc, buf);
            float s = group8_sum(acc[0], mask);
            if (l == 0 && col < valid) {
                u64 r = e * n + j0 + col;
                s = st_tail<F>(s, w + r * rb, xr, k8, k, st_srow<F>(sc, r), sc);
                y[p * n + j0 + col] = s;
            }
        }
    }
}
#endif

// Rows ids[0 .. n] of a stored table [·, width], dequantized: a thread per
// (row, unit, lane) writes the lane's values, then one per tail value.
template <class F>
__device__ __forceinline__ void st_table_item(float* dst, const u8* w, const u32* ids, u64 width,
                                              const StScales& sc, u64 i) {
    u64 units = width / F::UV, k8 = units * F::UV, per_row = units * 8 + (width - k8);
    u64 r = i / per_row, q = i % per_row;
    u64 row = ids[r];
    const u8* wr = w + row * F::row_bytes(width);
    const float* srow = st_srow<F>(sc, row);
    float* o = dst + r * width;
    if (q < units * 8) {
        u64 u = q / 8;
        unsigned l = (unsigned)(q % 8);
        float v[F::LV];
        F::lane(wr + u * F::UB, l, v, srow, (u32)(u * F::UV), sc);
#pragma unroll
        for (int c = 0; c < F::LV; c++) o[u * F::UV + 8 * c + l] = v[c];
    } else {
        u64 e = k8 + (q - units * 8);
        o[e] = F::elem(wr, e, srow, sc);
    }
}

#ifndef ST_HOST
template <class F>
__device__ __forceinline__ void st_table(float* dst, const u8* w, const u32* ids, u64 n,
                                         u64 width, const StScales& sc) {
    u64 units = width / F::UV, per_row = units * 8 + (width - units * F::UV);
    FOR_EACH(i, n * per_row) st_table_item<F>(dst, w, ids, width, sc, i);
}
#endif

// ---- the kernels, three per format (`cuda/stored.rs` names them):
// st_matmul_* (y, x, rows, w, n, k, scales), st_gather_* (y, x, x_div,
// experts, pairs, w, n, k, scales), st_table_* (dst, w, ids, n, width,
// scales); scales = (grid, grid_rows, bc, sh), null grids for the formats
// without one.
#ifndef ST_HOST

extern "C" __global__ void st_matmul_f16(float* y, const float* x, u64 rows, const u8* w, u64 n,
        u64 k, const float* grid, const u32* grid_rows, u32 bc, int sh) {
    dep_entry();
    st_matmul<StF16>(y, x, rows, w, n, k, StScales{grid, grid_rows, bc, sh});
}
extern "C" __global__ void st_gather_f16(float* y, const float* x, u64 x_div,
        const u32* experts, u64 pairs, const u8* w, u64 n, u64 k, const float* grid,
        const u32* grid_rows, u32 bc, int sh) {
    dep_entry();
    st_gather<StF16>(y, x, x_div, experts, pairs, w, n, k, StScales{grid, grid_rows, bc, sh});
}
extern "C" __global__ void st_table_f16(float* dst, const u8* w, const u32* ids, u64 n,
        u64 width, const float* grid, const u32* grid_rows, u32 bc, int sh) {
    dep_entry();
    st_table<StF16>(dst, w, ids, n, width, StScales{grid, grid_rows, bc, sh});
}

extern "C" __global__ void st_matmul_narrow_f16(float* y, const float* x, u64 rows, const u8* w,
        u64 n, u64 k, const float* grid, const u32* grid_rows, u32 bc, int sh) {
    dep_entry();
    st_matmul<StF16, StNarrow>(y, x, rows, w, n, k, StScales{grid, grid_rows, bc, sh});
}
extern "C" __global__ void st_matmul_deep_f16(float* y, const float* x, u64 rows, const u8* w,
        u64 n, u64 k, const float* grid, const u32* grid_rows, u32 bc, int sh) {
    dep_entry();
    st_matmul<StF16, StDeep>(y, x, rows, w, n, k, StScales{grid, grid_rows, bc, sh});
}
extern "C" __global__ void st_matmul_deep_bf16(float* y, const float* x, u64 rows, const u8* w,
        u64 n, u64 k, const float* grid, const u32* grid_rows, u32 bc, int sh) {
    dep_entry();
    st_matmul<StBF16, StDeep>(y, x, rows, w, n, k, StScales{grid, grid_rows, bc, sh});
}
extern "C" __global__ void st_matmul_narrow_bf16(float* y, const float* x, u64 rows, const u8* w,
        u64 n, u64 k, const float* grid, const u32* grid_rows, u32 bc, int sh) {
    dep_entry();
    st_matmul<StBF16, StNarrow>(y, x, rows, w, n, k, StScales{grid, grid_rows, bc, sh});
}

extern "C" __global__ void st_matmul_bf16(float* y, const float* x, u64 rows, const u8* w, u64 n,
        u64 k, const float* grid, const u32* grid_rows, u32 bc, int sh) {
    dep_entry();
    st_matmul<StBF16>(y, x, rows, w, n, k, StScales{grid, grid_rows, bc, sh});
}
extern "C" __global__ void st_gather_bf16(float* y, const float* x, u64 x_div,
        const u32* experts, u64 pairs, const u8* w, u64 n, u64 k, const float* grid,
        const u32* grid_rows, u32 bc, int sh) {
    dep_entry();
    st_gather<StBF16>(y, x, x_div, experts, pairs, w, n, k, StScales{grid, grid_rows, bc, sh});
}
extern "C" __global__ void st_table_bf16(float* dst, const u8* w, const u32* ids, u64 n,
        u64 width, const float* grid, const u32* grid_rows, u32 bc, int sh) {
    dep_entry();
    st_table<StBF16>(dst, w, ids, n, width, StScales{grid, grid_rows, bc, sh});
}

extern "C" __global__ void st_matmul_q4_0(float* y, const float* x, u64 rows, const u8* w, u64 n,
        u64 k, const float* grid, const u32* grid_rows, u32 bc, int sh) {
    dep_entry();
    st_matmul<StQ4_0>(y, x, rows, w, n, k, StScales{grid, grid_rows, bc, sh});
}
extern "C" __global__ void st_gather_q4_0(float* y, const float* x, u64 x_div,
        const u32* experts, u64 pairs, const u8* w, u64 n, u64 k, const float* grid,
        const u32* grid_rows, u32 bc, int sh) {
    dep_entry();
    st_gather<StQ4_0>(y, x, x_div, experts, pairs, w, n, k, StScales{grid, grid_rows, bc, sh});
}
extern "C" __global__ void st_table_q4_0(float* dst, const u8* w, const u32* ids, u64 n,
        u64 width, const float* grid, const u32* grid_rows, u32 bc, int sh) {
    dep_entry();
    st_table<StQ4_0>(dst, w, ids, n, width, StScales{grid, grid_rows, bc, sh});
}

extern "C" __global__ void st_matmul_q5_0(float* y, const float* x, u64 rows, const u8* w, u64 n,
        u64 k, const float* grid, const u32* grid_rows, u32 bc, int sh) {
    dep_entry();
    st_matmul<StQ5_0>(y, x, rows, w, n, k, StScales{grid, grid_rows, bc, sh});
}
extern "C" __global__ void st_gather_q5_0(float* y, const float* x, u64 x_div,
        const u32* experts, u64 pairs, const u8* w, u64 n, u64 k, const float* grid,
        const u32* grid_rows, u32 bc, int sh) {
    dep_entry();
    st_gather<StQ5_0>(y, x, x_div, experts, pairs, w, n, k, StScales{grid, grid_rows, bc, sh});
}
extern "C" __global__ void st_table_q5_0(float* dst, const u8* w, const u32* ids, u64 n,
        u64 width, const float* grid, const u32* grid_rows, u32 bc, int sh) {
    dep_entry();
    st_table<StQ5_0>(dst, w, ids, n, width, StScales{grid, grid_rows, bc, sh});
}

extern "C" __global__ void st_matmul_q5_1(float* y, const float* x, u64 rows, const u8* w, u64 n,
        u64 k, const float* grid, const u32* grid_rows, u32 bc, int sh) {
    dep_entry();
    st_matmul<StQ5_1>(y, x, rows, w, n, k, StScales{grid, grid_rows, bc, sh});
}
extern "C" __global__ void st_gather_q5_1(float* y, const float* x, u64 x_div,
        const u32* experts, u64 pairs, const u8* w, u64 n, u64 k, const float* grid,
        const u32* grid_rows, u32 bc, int sh) {
    dep_entry();
    st_gather<StQ5_1>(y, x, x_div, experts, pairs, w, n, k, StScales{grid, grid_rows, bc, sh});
}
extern "C" __global__ void st_table_q5_1(float* dst, const u8* w, const u32* ids, u64 n,
        u64 width, const float* grid, const u32* grid_rows, u32 bc, int sh) {
    dep_entry();
    st_table<StQ5_1>(dst, w, ids, n, width, StScales{grid, grid_rows, bc, sh});
}

extern "C" __global__ void st_matmul_q2_k(float* y, const float* x, u64 rows, const u8* w, u64 n,
        u64 k, const float* grid, const u32* grid_rows, u32 bc, int sh) {
    dep_entry();
    st_matmul<StQ2_K>(y, x, rows, w, n, k, StScales{grid, grid_rows, bc, sh});
}
extern "C" __global__ void st_gather_q2_k(float* y, const float* x, u64 x_div,
        const u32* experts, u64 pairs, const u8* w, u64 n, u64 k, const float* grid,
        const u32* grid_rows, u32 bc, int sh) {
    dep_entry();
    st_gather<StQ2_K>(y, x, x_div, experts, pairs, w, n, k, StScales{grid, grid_rows, bc, sh});
}
extern "C" __global__ void st_table_q2_k(float* dst, const u8* w, const u32* ids, u64 n,
        u64 width, const float* grid, const u32* grid_rows, u32 bc, int sh) {
    dep_entry();
    st_table<StQ2_K>(dst, w, ids, n, width, StScales{grid, grid_rows, bc, sh});
}

extern "C" __global__ void st_matmul_q3_k(float* y, const float* x, u64 rows, const u8* w, u64 n,
        u64 k, const float* grid, const u32* grid_rows, u32 bc, int sh) {
    dep_entry();
    st_matmul<StQ3_K>(y, x, rows, w, n, k, StScales{grid, grid_rows, bc, sh});
}
extern "C" __global__ void st_gather_q3_k(float* y, const float* x, u64 x_div,
        const u32* experts, u64 pairs, const u8* w, u64 n, u64 k, const float* grid,
        const u32* grid_rows, u32 bc, int sh) {
    dep_entry();
    st_gather<StQ3_K>(y, x, x_div, experts, pairs, w, n, k, StScales{grid, grid_rows, bc, sh});
}
extern "C" __global__ void st_table_q3_k(float* dst, const u8* w, const u32* ids, u64 n,
        u64 width, const float* grid, const u32* grid_rows, u32 bc, int sh) {
    dep_entry();
    st_table<StQ3_K>(dst, w, ids, n, width, StScales{grid, grid_rows, bc, sh});
}

extern "C" __global__ void st_matmul_q4_k(float* y, const float* x, u64 rows, const u8* w, u64 n,
        u64 k, const float* grid, const u32* grid_rows, u32 bc, int sh) {
    dep_entry();
    st_matmul<StQ4_K>(y, x, rows, w, n, k, StScales{grid, grid_rows, bc, sh});
}
extern "C" __global__ void st_gather_q4_k(float* y, const float* x, u64 x_div,
        const u32* experts, u64 pairs, const u8* w, u64 n, u64 k, const float* grid,
        const u32* grid_rows, u32 bc, int sh) {
    dep_entry();
    st_gather<StQ4_K>(y, x, x_div, experts, pairs, w, n, k, StScales{grid, grid_rows, bc, sh});
}
extern "C" __global__ void st_table_q4_k(float* dst, const u8* w, const u32* ids, u64 n,
        u64 width, const float* grid, const u32* grid_rows, u32 bc, int sh) {
    dep_entry();
    st_table<StQ4_K>(dst, w, ids, n, width, StScales{grid, grid_rows, bc, sh});
}

extern "C" __global__ void st_matmul_q5_k(float* y, const float* x, u64 rows, const u8* w, u64 n,
        u64 k, const float* grid, const u32* grid_rows, u32 bc, int sh) {
    dep_entry();
    st_matmul<StQ5_K>(y, x, rows, w, n, k, StScales{grid, grid_rows, bc, sh});
}
extern "C" __global__ void st_gather_q5_k(float* y, const float* x, u64 x_div,
        const u32* experts, u64 pairs, const u8* w, u64 n, u64 k, const float* grid,
        const u32* grid_rows, u32 bc, int sh) {
    dep_entry();
    st_gather<StQ5_K>(y, x, x_div, experts, pairs, w, n, k, StScales{grid, grid_rows, bc, sh});
}
extern "C" __global__ void st_table_q5_k(float* dst, const u8* w, const u32* ids, u64 n,
        u64 width, const float* grid, const u32* grid_rows, u32 bc, int sh) {
    dep_entry();
    st_table<StQ5_K>(dst, w, ids, n, width, StScales{grid, grid_rows, bc, sh});
}

extern "C" __global__ void st_matmul_q6_k(float* y, const float* x, u64 rows, const u8* w, u64 n,
        u64 k, const float* grid, const u32* grid_rows, u32 bc, int sh) {
    dep_entry();
    st_matmul<StQ6_K>(y, x, rows, w, n, k, StScales{grid, grid_rows, bc, sh});
}
extern "C" __global__ void st_gather_q6_k(float* y, const float* x, u64 x_div,
        const u32* experts, u64 pairs, const u8* w, u64 n, u64 k, const float* grid,
        const u32* grid_rows, u32 bc, int sh) {
    dep_entry();
    st_gather<StQ6_K>(y, x, x_div, experts, pairs, w, n, k, StScales{grid, grid_rows, bc, sh});
}
extern "C" __global__ void st_table_q6_k(float* dst, const u8* w, const u32* ids, u64 n,
        u64 width, const float* grid, const u32* grid_rows, u32 bc, int sh) {
    dep_entry();
    st_table<StQ6_K>(dst, w, ids, n, width, StScales{grid, grid_rows, bc, sh});
}

extern "C" __global__ void st_matmul_q8_k(float* y, const float* x, u64 rows, const u8* w, u64 n,
        u64 k, const float* grid, const u32* grid_rows, u32 bc, int sh) {
    dep_entry();
    st_matmul<StQ8_K>(y, x, rows, w, n, k, StScales{grid, grid_rows, bc, sh});
}
extern "C" __global__ void st_gather_q8_k(float* y, const float* x, u64 x_div,
        const u32* experts, u64 pairs, const u8* w, u64 n, u64 k, const float* grid,
        const u32* grid_rows, u32 bc, int sh) {
    dep_entry();
    st_gather<StQ8_K>(y, x, x_div, experts, pairs, w, n, k, StScales{grid, grid_rows, bc, sh});
}
extern "C" __global__ void st_table_q8_k(float* dst, const u8* w, const u32* ids, u64 n,
        u64 width, const float* grid, const u32* grid_rows, u32 bc, int sh) {
    dep_entry();
    st_table<StQ8_K>(dst, w, ids, n, width, StScales{grid, grid_rows, bc, sh});
}

extern "C" __global__ void st_matmul_iq2_xxs(float* y, const float* x, u64 rows, const u8* w, u64 n,
        u64 k, const float* grid, const u32* grid_rows, u32 bc, int sh) {
    dep_entry();
    st_matmul<StIq2xxs>(y, x, rows, w, n, k, StScales{grid, grid_rows, bc, sh});
}
extern "C" __global__ void st_gather_iq2_xxs(float* y, const float* x, u64 x_div,
        const u32* experts, u64 pairs, const u8* w, u64 n, u64 k, const float* grid,
        const u32* grid_rows, u32 bc, int sh) {
    dep_entry();
    st_gather<StIq2xxs>(y, x, x_div, experts, pairs, w, n, k, StScales{grid, grid_rows, bc, sh});
}
extern "C" __global__ void st_table_iq2_xxs(float* dst, const u8* w, const u32* ids, u64 n,
        u64 width, const float* grid, const u32* grid_rows, u32 bc, int sh) {
    dep_entry();
    st_table<StIq2xxs>(dst, w, ids, n, width, StScales{grid, grid_rows, bc, sh});
}

extern "C" __global__ void st_matmul_mxfp4(float* y, const float* x, u64 rows, const u8* w, u64 n,
        u64 k, const float* grid, const u32* grid_rows, u32 bc, int sh) {
    dep_entry();
    st_matmul<StMxfp4>(y, x, rows, w, n, k, StScales{grid, grid_rows, bc, sh});
}
extern "C" __global__ void st_gather_mxfp4(float* y, const float* x, u64 x_div,
        const u32* experts, u64 pairs, const u8* w, u64 n, u64 k, const float* grid,
        const u32* grid_rows, u32 bc, int sh) {
    dep_entry();
    st_gather<StMxfp4>(y, x, x_div, experts, pairs, w, n, k, StScales{grid, grid_rows, bc, sh});
}
extern "C" __global__ void st_table_mxfp4(float* dst, const u8* w, const u32* ids, u64 n,
        u64 width, const float* grid, const u32* grid_rows, u32 bc, int sh) {
    dep_entry();
    st_table<StMxfp4>(dst, w, ids, n, width, StScales{grid, grid_rows, bc, sh});
}

extern "C" __global__ void st_matmul_fp8(float* y, const float* x, u64 rows, const u8* w, u64 n,
        u64 k, const float* grid, const u32* grid_rows, u32 bc, int sh) {
    dep_entry();
    st_matmul<StFp8>(y, x, rows, w, n, k, StScales{grid, grid_rows, bc, sh});
}
extern "C" __global__ void st_gather_fp8(float* y, const float* x, u64 x_div,
        const u32* experts, u64 pairs, const u8* w, u64 n, u64 k, const float* grid,
        const u32* grid_rows, u32 bc, int sh) {
    dep_entry();
    st_gather<StFp8>(y, x, x_div, experts, pairs, w, n, k, StScales{grid, grid_rows, bc, sh});
}
extern "C" __global__ void st_table_fp8(float* dst, const u8* w, const u32* ids, u64 n,
        u64 width, const float* grid, const u32* grid_rows, u32 bc, int sh) {
    dep_entry();
    st_table<StFp8>(dst, w, ids, n, width, StScales{grid, grid_rows, bc, sh});
}

extern "C" __global__ void st_matmul_fp4(float* y, const float* x, u64 rows, const u8* w, u64 n,
        u64 k, const float* grid, const u32* grid_rows, u32 bc, int sh) {
    dep_entry();
    st_matmul<StFp4>(y, x, rows, w, n, k, StScales{grid, grid_rows, bc, sh});
}
extern "C" __global__ void st_gather_fp4(float* y, const float* x, u64 x_div,
        const u32* experts, u64 pairs, const u8* w, u64 n, u64 k, const float* grid,
        const u32* grid_rows, u32 bc, int sh) {
    dep_entry();
    st_gather<StFp4>(y, x, x_div, experts, pairs, w, n, k, StScales{grid, grid_rows, bc, sh});
}
extern "C" __global__ void st_table_fp4(float* dst, const u8* w, const u32* ids, u64 n,
        u64 width, const float* grid, const u32* grid_rows, u32 bc, int sh) {
    dep_entry();
    st_table<StFp4>(dst, w, ids, n, width, StScales{grid, grid_rows, bc, sh});
}
#endif
