// Host emulation of crates/engine/src/backend/cuda/kernels/stored.cu (GPU
// run 29, docs/GPU.md): every format's lane function against the oracle
// fixtures (tests/fixtures/quant), and the chunk pipeline's indexing
// (st_issue / st_issue_x / st_compute in st_pass's order, cp.async as
// memcpy, a poisoned stage) against the CPU f32 kernel's dot over the
// expected values. No GPU needed:
//
//   mkdir -p /tmp/stq/fx && python3 - <<'PY'   # fixtures to raw files
//   import json, struct, os
//   d = "tests/fixtures/quant/"
//   for f in os.listdir(d):
//       b = open(d + f, "rb").read(); n = struct.unpack("<Q", b[:8])[0]
//       h = json.loads(b[8:8 + n]); data = b[8 + n:]
//       for t in ("blocks", "values"):
//           s, e = h[t]["data_offsets"]
//           open(f"/tmp/stq/fx/{f.split('.')[0]}.{t}", "wb").write(data[s:e])
//   PY
//   g++ -O2 -ffp-contract=off -std=c++17 \
//     -DSTORED_CU='"crates/engine/src/backend/cuda/kernels/stored.cu"' \
//     -I. -o /tmp/stq/emu docs/gpu-logs/29-stored-emu.cpp && /tmp/stq/emu
#include <cstdint>
#include <cstring>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <string>
typedef uint32_t u32; typedef uint16_t u16; typedef uint8_t u8; typedef uint64_t u64;
#define __device__
#define __forceinline__ inline
#define __constant__ static const
#define ST_HOST 1
static inline float h2f(u16 h) { _Float16 f; memcpy(&f, &h, 2); return (float)f; }
static inline float __uint_as_float(u32 u) { float f; memcpy(&f, &u, 4); return f; }
static inline float __int_as_float(int u) { float f; memcpy(&f, &u, 4); return f; }
static inline u32 __float_as_uint(float f) { u32 u; memcpy(&u, &f, 4); return u; }
static inline void st_cp16(u8* s, const u8* g) { memcpy(s, g, 16); }
static inline void st_cp4(float* s, const float* g) { memcpy(s, g, 4); }
template <class T> static inline T __ldg(const T* p) { return *p; }
#include STORED_CU

static std::vector<u8> rd(const std::string& p) {
    FILE* f = fopen(p.c_str(), "rb"); if (!f) { perror(p.c_str()); exit(1); }
    std::vector<u8> v; u8 b[65536]; size_t n;
    while ((n = fread(b, 1, sizeof b, f)) > 0) v.insert(v.end(), b, b + n);
    fclose(f); return v;
}
static bool same(float a, float b) { return (std::isnan(a) && std::isnan(b)) || __float_as_uint(a) == __float_as_uint(b); }
static u64 rs = 88172645463325252ull;
static u64 rnd() { rs ^= rs << 13; rs ^= rs >> 7; rs ^= rs << 17; return rs; }
static float rndf() { return ((rnd() >> 40) / float(1 << 24)) * 2 - 1; }

int fails = 0;

// Lane functions over fixture units: values of unit u, lane l, c -> element 8c+l.
template <class F>
void check_lanes(const char* name, const u8* blocks, const float* vals, u64 units, const float* scale1) {
    u32 ones_rows[1] = {0};
    StScales sc{scale1, ones_rows, 1u << 20, 20};
    int bad = 0;
    for (u64 u = 0; u < units; u++)
        for (unsigned l = 0; l < 8; l++) {
            float v[F::LV];
            F::lane(blocks + u * F::UB, l, v, scale1, (u32)(u * F::UV), sc);
            for (int c = 0; c < F::LV; c++) {
                float want = vals[u * F::UV + 8 * c + l];
                if (!same(v[c], want) && bad++ < 5)
                    printf("  %s unit %llu lane %u c %d: got %a want %a\n", name, (unsigned long long)u, l, c, v[c], want);
            }
        }
    // elem (element types): every value
    if (F::UV == 8)
        for (u64 i = 0; i < units * 8; i++) {
            float g = F::elem(blocks, i, scale1, sc);
            if (!same(g, vals[i]) && bad++ < 10) printf("  %s elem %llu: got %a want %a\n", name, (unsigned long long)i, g, vals[i]);
        }
    printf("lanes %-8s units=%llu %s\n", name, (unsigned long long)units, bad ? "FAIL" : "ok");
    if (bad) fails++;
}

// CPU reference dot (f32_matmul::dot)
static float dot(const float* w, const float* x, u64 k) {
    u64 k8 = k / 8 * 8; float acc[8] = {0};
    for (u64 c = 0; c < k8; c += 8) for (int l = 0; l < 8; l++) acc[l] = fmaf(w[c + l], x[c + l], acc[l]);
    float s = ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]));
    for (u64 i = k8; i < k; i++) s = fmaf(w[i], x[i], s);
    return s;
}

// Emulated st_matmul: st_pass's issue/compute order for one block.
template <class F>
void emu_matmul(const u8* w, u64 n, u64 k, const float* x, u64 rows, const StScales& sc, float* y) {
    static u8 buf[ST_STAGES * ST_STAGE];
    const u64 upc = StGeo<F>::UPC, stage = ST_STAGE;
    u64 units = k / F::UV, rb = F::row_bytes(k), chunks = (units + upc - 1) / upc, k8 = units * F::UV;
    for (u64 j0 = 0; j0 < n; j0 += ST_COLS) {
        u32 valid = (u32)st_min(ST_COLS, n - j0);
        for (u64 r0 = 0; r0 < rows; r0 += ST_TILE) {
            u64 nr = st_min(ST_TILE, rows - r0);
            const float* xr = x + r0 * k;
            static float acc[ST_THREADS][ST_TILE];
            memset(acc, 0, sizeof acc);
            memset(buf, 0xAB, sizeof buf);
            auto issue = [&](u64 c) {
                u8* st = buf + (c % ST_STAGES) * stage;
                u64 cnt = st_min(upc, units - c * upc);
                for (u32 t = 0; t < ST_THREADS; t++) {
                    st_issue<F>(st, w, rb, j0, valid, c * upc, cnt, t, ST_THREADS);
                    st_issue_x((float*)(st + ST_XOFF), xr, k, nr, c * upc * F::UV, cnt * F::UV, t, ST_THREADS);
                }
            };
            for (u64 c = 0; c + 1 < ST_STAGES; c++)
                if (c < chunks) issue(c);
            for (u64 c = 0; c < chunks; c++) {
                u64 next = c + ST_STAGES - 1;
                if (next < chunks) issue(next);
                for (u32 t = 0; t < ST_THREADS; t++) {
                    unsigned col = t / 8, l = t & 7;
                    if (col >= valid) continue;
                    u64 wrow = j0 + col, u0 = c * upc;
                    const u8* st = buf + (c % ST_STAGES) * stage;
                    float a[ST_TILE]; memcpy(a, acc[t], sizeof a);
                    st_compute<F, ST_TILE>(a, nr, (const float*)(st + ST_XOFF), st + col * ST_STRIDE, w + wrow * rb + u0 * F::UB, u0, st_min(upc, units - u0), l, st_srow<F>(sc, wrow), sc);
                    memcpy(acc[t], a, sizeof a);
                }
            }
            for (u32 col = 0; col < valid; col++)
                for (u64 t = 0; t < nr; t++) {
                    float* a8[8]; for (int l = 0; l < 8; l++) a8[l] = &acc[col * 8 + l][t];
                    float s = ((*a8[0] + *a8[4]) + (*a8[2] + *a8[6])) + ((*a8[1] + *a8[5]) + (*a8[3] + *a8[7]));
                    u64 j = j0 + col;
                    s = st_tail<F>(s, w + j * rb, xr + t * k, k8, k, st_srow<F>(sc, j), sc);
                    y[(r0 + t) * n + j] = s;
                }
        }
    }
}

// A matrix [n, k] from random fixture units (k = m units' values, element
// types: plus a tail of `tail` values taken from more units), its expected
// values (fixture values times the scale grid), through both the emulated
// kernel and st_table_item; against the CPU-order dot.
template <class F>
void check_matmul(const char* name, const u8* blocks, const float* vals, u64 funits, u64 n, u64 m, u64 tail, u32 bc, u32 br) {
    u64 k = m * F::UV + tail;
    u64 rb = F::row_bytes(k);
    std::vector<u8> wbuf(n * rb + 96, 0); u8* wp = wbuf.data() + 21; // deliberately unaligned
    struct { u8* p; u8& operator[](size_t i) { return p[i]; } u8* data() { return p; } } w{wp};
    std::vector<float> want(n * k);
    // units from the fixture; tails: whole 8-value units truncated
    for (u64 r = 0; r < n; r++) {
        for (u64 u = 0; u * F::UV < k; u++) {
            u64 f = rnd() % funits;
            u64 nv = st_min(F::UV, k - u * F::UV);
            u64 nb = F::UV == 8 ? F::row_bytes(nv) : F::UB;
            memcpy(&w[r * rb + u * F::UB], blocks + f * F::UB, nb);
            for (u64 i = 0; i < nv; i++) want[r * k + u * F::UV + i] = vals[f * F::UV + i];
        }
    }
    // scale grid
    u64 gc = (k + bc - 1) / bc, grows = (n + br - 1) / br;
    std::vector<float> grid(grows * gc);
    for (auto& g : grid) g = F::SCALED ? std::ldexp(1.0f + 0.5f * rndf(), (int)(rnd() % 9) - 4) : 1.0f;
    std::vector<u32> growoff(n);
    for (u64 r = 0; r < n; r++) growoff[r] = (u32)((r / br) * gc);
    int sh = -1; for (int b = 0; b < 31; b++) if ((1u << b) == bc) sh = b;
    StScales sc{grid.data(), growoff.data(), bc, sh};
    if (F::SCALED)
        for (u64 r = 0; r < n; r++)
            for (u64 c = 0; c < k; c++) {
                u64 cc = (F::UB == 4) ? (c & ~1ull) : c;  // FP4 pairs share the even element's scale
                want[r * k + c] = want[r * k + c] * grid[growoff[r] + cc / bc];
            }
    // any NaN in want -> zero that value's bytes out is hard; skip NaN rows in dot comparisons
    u64 rows = 7;
    std::vector<float> x(rows * k); for (auto& v : x) v = rndf();
    std::vector<float> y(rows * n), ref(rows * n);
    emu_matmul<F>(w.data(), n, k, x.data(), rows, sc, y.data());
    for (u64 t = 0; t < rows; t++) for (u64 j = 0; j < n; j++) ref[t * n + j] = dot(&want[j * k], &x[t * k], k);
    int bad = 0;
    for (u64 i = 0; i < rows * n; i++) if (!same(y[i], ref[i]) && bad++ < 5) printf("  %s matmul [%llu] got %a want %a\n", name, (unsigned long long)i, y[i], ref[i]);
    // table rows
    std::vector<u32> ids = {0, (u32)(n - 1), (u32)(n / 2), 3};
    std::vector<float> tab(ids.size() * k, -7.0f);
    u64 per_row = (k / F::UV) * 8 + (k - k / F::UV * F::UV);
    for (u64 i = 0; i < ids.size() * per_row; i++) st_table_item<F>(tab.data(), w.data(), ids.data(), k, sc, i);
    for (u64 r = 0; r < ids.size(); r++) for (u64 c = 0; c < k; c++)
        if (!same(tab[r * k + c], want[ids[r] * k + c]) && bad++ < 10) printf("  %s table row %llu col %llu got %a want %a\n", name, (unsigned long long)ids[r], (unsigned long long)c, tab[r*k+c], want[ids[r]*k+c]);
    printf("matmul %-8s [%llu,%llu] upc=%d chunks=%llu %s\n", name, (unsigned long long)n, (unsigned long long)k, (int)StGeo<F>::UPC,
           (unsigned long long)((k / F::UV + StGeo<F>::UPC - 1) / StGeo<F>::UPC), bad ? "FAIL" : "ok");
    if (bad) fails++;
}

template <class F>
void run(const char* name, const char* fx, u32 bc = 128, u32 br = 128) {
    std::string b = std::string("/tmp/stq/fx/") + fx;
    auto blocks = rd(b + ".blocks"); auto vb = rd(b + ".values");
    std::vector<float> vals(vb.size() / 4); memcpy(vals.data(), vb.data(), vb.size());
    u64 units = vals.size() / F::UV;
    std::vector<float> one(1 << 16, 1.0f);
    check_lanes<F>(name, blocks.data(), vals.data(), units, one.data());
    // matrices: several shapes (few/many chunks, partial column groups)
    // For NaN-free dot checks drop NaN-producing units.
    std::vector<u8> cb; std::vector<float> cv; u64 cu = 0;
    for (u64 u = 0; u < units; u++) {
        bool nan = false; for (u64 i = 0; i < F::UV; i++) nan |= std::isnan(vals[u * F::UV + i]) || std::isinf(vals[u*F::UV+i]);
        if (nan) continue;
        cb.insert(cb.end(), blocks.begin() + u * F::UB, blocks.begin() + (u + 1) * F::UB);
        cv.insert(cv.end(), vals.begin() + u * F::UV, vals.begin() + (u + 1) * F::UV);
        cu++;
    }
    u64 tails[2] = {0, 0};
    if (F::UV == 8) { tails[0] = F::UB == 4 ? 6 : 5; tails[1] = F::UB == 4 ? 2 : 3; }
    check_matmul<F>(name, cb.data(), cv.data(), cu, 37, 1, tails[1], bc, br);
    check_matmul<F>(name, cb.data(), cv.data(), cu, 70, F::UV == 8 ? 300 : (F::UV == 32 ? 87 : 13), tails[0], bc, br);
    check_matmul<F>(name, cb.data(), cv.data(), cu, 33, F::UV == 8 ? 46 : 2, 0, bc, br);
}

int main() {
    run<StF16>("f16", "f16");
    run<StBF16>("bf16", "bf16");
    run<StQ4_0>("q4_0", "q4_0");
    run<StQ5_0>("q5_0", "q5_0");
    run<StQ5_1>("q5_1", "q5_1");
    run<StMxfp4>("mxfp4", "mxfp4");
    run<StQ2_K>("q2_k", "q2_k");
    run<StQ3_K>("q3_k", "q3_k");
    run<StQ4_K>("q4_k", "q4_k");
    run<StQ5_K>("q5_k", "q5_k");
    run<StQ6_K>("q6_k", "q6_k");
    run<StQ8_K>("q8_k", "q8_k");
    run<StIq2xxs>("iq2_xxs", "iq2_xxs");
    run<StFp8>("fp8", "f8_e4m3", 128, 128);
    run<StFp8>("fp8b", "f8_e4m3", 48, 5);
    run<StFp4>("fp4", "fp4_e2m1", 32, 1);
    run<StFp4>("fp4b", "fp4_e2m1", 6, 3);
    printf("%s (%d failing)\n", fails ? "FAILURES" : "ALL OK", fails);
    return fails != 0;
}
