// Layout kernels: strided copies (concat / split of columns), embedding
// gathers (f32, and Q8_0 / Q4_1 rows dequantized exactly as candle does).

// dst[r·dst_stride + dst_off + c] = src[r·src_stride + src_off + c].
extern "C" __global__ void copy2d(float* dst, u64 dst_stride, u64 dst_off, const float* src,
                                  u64 src_stride, u64 src_off, u64 nrows, u64 ncols) {
    dep_entry();
    FOR_EACH(i, nrows * ncols) {
        u64 r = i / ncols, c = i % ncols;
        dst[r * dst_stride + dst_off + c] = src[r * src_stride + src_off + c];
    }
}

// Up to four whole-buffer copies in one launch (a pure unit's inputs into
// its graph's buffers, its outputs out of them: `buf::copy_many`); an
// unused pair has n = 0.
extern "C" __global__ void copy4_f32(float* d0, const float* s0, u64 n0, float* d1,
                                     const float* s1, u64 n1, float* d2, const float* s2, u64 n2,
                                     float* d3, const float* s3, u64 n3) {
    dep_entry();
    FOR_EACH(i, n0 + n1 + n2 + n3) {
        if (i < n0) {
            d0[i] = s0[i];
        } else if (i < n0 + n1) {
            d1[i - n0] = s1[i - n0];
        } else if (i < n0 + n1 + n2) {
            d2[i - n0 - n1] = s2[i - n0 - n1];
        } else {
            d3[i - n0 - n1 - n2] = s3[i - n0 - n1 - n2];
        }
    }
}

// Up to eight whole-buffer copies in one launch (`buf::copy_many`: a pure
// unit's five inputs, or its six outputs, in one launch rather than two);
// an unused pair has n = 0.
extern "C" __global__ void copy8_f32(float* d0, const float* s0, u64 n0, float* d1,
                                     const float* s1, u64 n1, float* d2, const float* s2, u64 n2,
                                     float* d3, const float* s3, u64 n3, float* d4,
                                     const float* s4, u64 n4, float* d5, const float* s5, u64 n5,
                                     float* d6, const float* s6, u64 n6, float* d7,
                                     const float* s7, u64 n7) {
    dep_entry();
    float* d[8] = {d0, d1, d2, d3, d4, d5, d6, d7};
    const float* src[8] = {s0, s1, s2, s3, s4, s5, s6, s7};
    u64 n[8] = {n0, n1, n2, n3, n4, n5, n6, n7};
    u64 total = 0;
#pragma unroll
    for (int p = 0; p < 8; p++) total += n[p];
    FOR_EACH(i, total) {
        u64 at = i;
#pragma unroll
        for (int p = 0; p < 8; p++) {
            if (at < n[p]) {
                d[p][at] = src[p][at];
                break;
            }
            at -= n[p];
        }
    }
}

// Up to four column parts of src [nrows, w0 + w1 + w2 + w3] into their own
// buffers in one pass (`split_cols`; an unused part has width 0).
extern "C" __global__ void split_cols4(float* d0, float* d1, float* d2, float* d3,
                                       const float* src, u64 nrows, u64 w0, u64 w1, u64 w2,
                                       u64 w3) {
    dep_entry();
    u64 period = w0 + w1 + w2 + w3;
    FOR_EACH(i, nrows * period) {
        u64 r = i / period, c = i % period;
        float v = src[i];
        if (c < w0) {
            d0[r * w0 + c] = v;
        } else if (c < w0 + w1) {
            d1[r * w1 + c - w0] = v;
        } else if (c < w0 + w1 + w2) {
            d2[r * w2 + c - w0 - w1] = v;
        } else {
            d3[r * w3 + c - w0 - w1 - w2] = v;
        }
    }
}

// Rows `ids` of an f32 table `[V, width]`.
extern "C" __global__ void gather_f32(float* dst, const float* table, const u32* ids, u64 n,
                                      u64 width) {
    dep_entry();
    FOR_EACH(i, n * width) {
        u64 r = i / width, c = i % width;
        dst[i] = table[(u64)ids[r] * width + c];
    }
}

// Rows `ids` of a GGUF Q8_0 table (34-byte blocks `d: f16, qs: [i8; 32]`):
// `q·d`, exact in f32.
extern "C" __global__ void gather_q8_0(float* dst, const u8* table, const u32* ids, u64 n,
                                       u64 width) {
    dep_entry();
    u64 row_bytes = width / 32 * 34;
    FOR_EACH(i, n * width) {
        u64 r = i / width, c = i % width;
        const u8* blk = table + (u64)ids[r] * row_bytes + c / 32 * 34;
        float d = h2f((u16)blk[0] | ((u16)blk[1] << 8));
        dst[i] = (float)(signed char)blk[2 + c % 32] * d;
    }
}

// Rows `ids` of a GGUF Q4_1 table (20-byte blocks `d, m: f16, qs: [u8;
// 16]`): `u·d + m`, rounded once (u·d is exact), as candle's dequantize.
extern "C" __global__ void gather_q4_1(float* dst, const u8* table, const u32* ids, u64 n,
                                       u64 width) {
    dep_entry();
    u64 row_bytes = width / 32 * 20;
    FOR_EACH(i, n * width) {
        u64 r = i / width, c = i % width;
        const u8* blk = table + (u64)ids[r] * row_bytes + c / 32 * 20;
        float d = h2f((u16)blk[0] | ((u16)blk[1] << 8));
        float m = h2f((u16)blk[2] | ((u16)blk[3] << 8));
        u32 j = c % 32;
        u32 u = j < 16 ? (blk[4 + j] & 0x0F) : (blk[4 + j - 16] >> 4);
        dst[i] = (float)u * d + m;
    }
}

// Step ops (a decode / verify step replayed as a CUDA graph): the cache
// length `pos` is step[0] of the step parameters written before each
// launch, so the same launch serves every position.

// dst = rows pos .. pos + n/width of src [_, width].
extern "C" __global__ void rows_step_f32(float* dst, const float* src, u64 width, u64 n,
                                         const u32* step) {
    dep_entry();
    u64 at = (u64)step[0] * width;
    FOR_EACH(i, n) dst[i] = src[at + i];
}

// Rows pos .. of dst [_, width] = src (n values).
extern "C" __global__ void write_rows_step_f32(float* dst, const float* src, u64 width, u64 n,
                                               const u32* step) {
    dep_entry();
    u64 at = (u64)step[0] * width;
    FOR_EACH(i, n) dst[at + i] = src[i];
}

// Row blocks of several sources into several buffers in one launch
// (`Backend::append_row_blocks`: continuous batching's cache writes, one
// launch for every session's keys and values of a layer instead of a
// split and an append per head and session). Copy c of `n` is the table's
// entries 5c .. 5c + 4: source address (already at its first value),
// source row stride, rows, destination address (already at its first
// free value), `width` values a row.
extern "C" __global__ void copy_row_blocks_f32(const u64* table, u64 n, u64 max_rows,
                                               u64 width) {
    dep_entry();
    FOR_EACH(i, n * max_rows * width) {
        u64 c = i / (max_rows * width), r = (i / width) % max_rows, e = i % width;
        const u64* t = table + 5 * c;
        if (r < t[2]) ((float*)t[3])[r * width + e] = ((const float*)t[0])[r * t[1] + e];
    }
}
