// Host check of crates/engine/src/backend/cuda/kernels/kq8.cu's format
// decoders (the fast kernel set's Q2_K..Q6_K and IQ2_XXS products, GPU
// run 30, docs/GPU.md): for every block of the oracle fixtures
// (tests/fixtures/quant) and every lane part p, the 32 signed weights,
// sub-block scales and minima a lane decodes give, in the ggml order
// `(d·sc)·w − dmin·m`, exactly the fixture's dequantized values; and a
// lane's dp4a sums equal plain integer sums. No GPU needed:
//
//   mkdir -p /tmp/stq/fx && (the python snippet of 29-stored-emu.cpp)
//   g++ -O2 -ffp-contract=off -std=c++17 \
//     -DSTORED_CU='"crates/engine/src/backend/cuda/kernels/stored.cu"' \
//     -DKQ8_CU='"crates/engine/src/backend/cuda/kernels/kq8.cu"' \
//     -I. -o /tmp/stq/kq8 docs/gpu-logs/30-kq8-emu.cpp && /tmp/stq/kq8
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
#define KQ_HOST 1
static inline float h2f(u16 h) { _Float16 f; memcpy(&f, &h, 2); return (float)f; }
static inline float __uint_as_float(u32 u) { float f; memcpy(&f, &u, 4); return f; }
static inline float __int_as_float(int u) { float f; memcpy(&f, &u, 4); return f; }
static inline u32 __float_as_uint(float f) { u32 u; memcpy(&u, &f, 4); return u; }
static inline void st_cp16(u8* s, const u8* g) { memcpy(s, g, 16); }
static inline void st_cp4(float* s, const float* g) { memcpy(s, g, 4); }
template <class T> static inline T __ldg(const T* p) { return *p; }
// CUDA's integer intrinsics, as the PTX ISA defines them.
static inline u32 __funnelshift_r(u32 lo, u32 hi, u32 shift) {
    u64 v = ((u64)hi << 32) | lo; return (u32)(v >> (shift & 31));
}
static inline u32 __vsub4(u32 a, u32 b) {
    u32 r = 0;
    for (int i = 0; i < 4; i++) r |= (u32)((u8)((a >> (8 * i)) - (b >> (8 * i)))) << (8 * i);
    return r;
}
static inline int __dp4a(int a, int b, int c) {
    for (int i = 0; i < 4; i++) c += (int)(int8_t)(a >> (8 * i)) * (int)(int8_t)(b >> (8 * i));
    return c;
}
#include STORED_CU
#include KQ8_CU

static std::vector<u8> rd(const std::string& p) {
    FILE* f = fopen(p.c_str(), "rb"); if (!f) { perror(p.c_str()); exit(1); }
    std::vector<u8> v; u8 b[65536]; size_t n;
    while ((n = fread(b, 1, sizeof b, f)) > 0) v.insert(v.end(), b, b + n);
    fclose(f); return v;
}
static bool same(float a, float b) { return (std::isnan(a) && std::isnan(b)) || __float_as_uint(a) == __float_as_uint(b); }
static u64 rs = 88172645463325252ull;
static u64 rnd() { rs ^= rs << 13; rs ^= rs >> 7; rs ^= rs << 17; return rs; }
int fails = 0;

template <class F>
void check(const char* name) {
    std::string base = std::string("/tmp/stq/fx/") + name;
    std::vector<u8> blocks = rd(base + ".blocks");
    std::vector<u8> raw = rd(base + ".values");
    const float* vals = (const float*)raw.data();
    size_t nb = blocks.size() / F::BB;
    // Padding for the two-word loads past the last block.
    blocks.resize(blocks.size() + 16);
    int bad = 0;
    for (size_t b = 0; b < nb; b++) {
        const u8* blk = blocks.data() + b * F::BB;
        float d, dmin;
        F::scales(blk, d, dmin);
        for (u32 p = 0; p < 8; p++) {
            KqPart o;
            F::part(blk, p, o);
            u32 a[8];
            int want_dot0 = 0, want_dot1 = 0, want_q0 = 0, want_q1 = 0;
            for (int i = 0; i < 32; i++) {
                int w = (int8_t)(o.w[i / 4] >> (8 * (i % 4)));
                int sc = i < 16 ? o.sc0 : o.sc1, m = i < 16 ? o.m0 : o.m1;
                float v = (d * (float)sc) * (float)w;
                if (F::MIN) v = v - dmin * (float)m;
                float want = vals[b * 256 + 32 * p + i];
                if (!same(v, want) && bad++ < 5)
                    printf("  %s block %zu part %u value %d: got %a want %a (w %d sc %d m %d)\n", name, b, p, i, v, want, w, sc, m);
                int q = (int)(rnd() % 255) - 127;
                if (i % 4 == 0) a[i / 4] = 0;
                a[i / 4] |= (u32)(u8)q << (8 * (i % 4));
                (i < 16 ? want_dot0 : want_dot1) += w * q;
                (i < 16 ? want_q0 : want_q1) += q;
            }
            int sumi, summ;
            kq_lane_sums(o, a, sumi, summ);
            int ws = o.sc0 * want_dot0 + o.sc1 * want_dot1, wm = o.m0 * want_q0 + o.m1 * want_q1;
            if ((sumi != ws || summ != wm) && bad++ < 5)
                printf("  %s block %zu part %u: sums %d %d want %d %d\n", name, b, p, sumi, summ, ws, wm);
        }
    }
    printf("kq8 %-8s blocks=%zu %s\n", name, nb, bad ? "FAIL" : "ok");
    if (bad) fails++;
}

int main() {
    check<KqQ2K>("q2_k");
    check<KqQ3K>("q3_k");
    check<KqQ45K<0>>("q4_k");
    check<KqQ45K<1>>("q5_k");
    check<KqQ6K>("q6_k");
    check<KqIq2xxs>("iq2_xxs");
    printf("%s\n", fails ? "FAILED" : "all ok");
    return fails != 0;
}
