/*
 * Reference implementation of the ds4 sampling law (shared/specs/sampling.md
 * sections 3 and 4), written from the spec in the shape of antirez/ds4's
 * ds4.c sampler (sample_argmax, sample_full_vocab, sample_top_p_min_p,
 * xorshift64*). It is the oracle for tests/fixtures/sampling/ds4_*.
 *
 * Decisions the spec leaves open, mirrored in crates/sampling/src/ds4.rs:
 *   - the full-vocabulary sort (top_p < 1) breaks logit ties by ascending id
 *     (ds4 uses qsort; glibc's merge sort is stable, so this is what it does);
 *   - `fallback` marks answers produced by the argmax fallback (nothing beat
 *     -1e30 in the argmax scan, no finite logit, or a non-finite/zero sum).
 *
 * Modes (stdin, one record per line, all integers decimal, floats as the
 * hex bit pattern of an IEEE float32 for logits and %.17g for parameters):
 *   stream SEED N           -> N lines "OUT_HEX UNIFORM_BITS_HEX"
 *   case V T TOP_K TOP_P MIN_P SEED DRAWS L0 .. L(V-1)
 *                           -> "tok tok ... ; draws fallback"
 * Build: gcc -O2 -ffp-contract=off -std=c11 ds4_ref.c -lm
 */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NEG_INF_F (-1e30f)

static uint64_t g_draws;
static int g_fallback;

static uint64_t rng_next(uint64_t *state) {
    uint64_t x = *state;
    if (x == 0) x = 0x9e3779b97f4a7c15ULL;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *state = x;
    return x * 0x2545F4914F6CDD1DULL;
}

static float rng_f32(uint64_t *state) {
    g_draws++;
    return (float)((rng_next(state) >> 40) & 0xFFFFFFu) / 16777216.0f;
}

static int sample_argmax(const float *l, uint32_t n) {
    int best = 0;
    float best_v = NEG_INF_F;
    int found = 0;
    for (uint32_t i = 0; i < n; i++) {
        if (l[i] > best_v) {
            best_v = l[i];
            best = (int)i;
            found = 1;
        }
    }
    if (!found) g_fallback = 1;
    return best;
}

typedef struct { int id; float logit; float prob; } cand_t;

static int cand_cmp(const void *a, const void *b) {
    const cand_t *x = a, *y = b;
    if (x->logit > y->logit) return -1;
    if (x->logit < y->logit) return 1;
    return (x->id > y->id) - (x->id < y->id);
}

static int full_vocab(const float *l, uint32_t n, float t, float top_p, float min_p, uint64_t *rng) {
    float max_logit = NEG_INF_F;
    int best = 0;
    uint32_t finite = 0;
    for (uint32_t i = 0; i < n; i++) {
        if (!isfinite(l[i])) continue;
        finite++;
        if (l[i] > max_logit) { max_logit = l[i]; best = (int)i; }
    }
    if (finite == 0) { g_fallback = 1; return sample_argmax(l, n); }
    if (top_p >= 1.0f) {
        const float min_rel = min_p > 0.0f ? min_p : 0.0f;
        float sum = 0.0f;
        for (uint32_t i = 0; i < n; i++) {
            if (!isfinite(l[i])) continue;
            const float p = expf((l[i] - max_logit) / t);
            if (p < min_rel) continue;
            sum += p;
        }
        if (sum <= 0.0f || !isfinite(sum)) { g_fallback = 1; return best; }
        float r = rng_f32(rng) * sum;
        for (uint32_t i = 0; i < n; i++) {
            if (!isfinite(l[i])) continue;
            const float p = expf((l[i] - max_logit) / t);
            if (p < min_rel) continue;
            r -= p;
            if (r <= 0.0f) return (int)i;
        }
        return best;
    }
    cand_t *c = malloc((size_t)finite * sizeof *c);
    if (!c) { perror("malloc"); exit(2); }
    uint32_t m = 0;
    float sum = 0.0f;
    for (uint32_t i = 0; i < n; i++) {
        if (!isfinite(l[i])) continue;
        const float p = expf((l[i] - max_logit) / t);
        c[m].id = (int)i; c[m].logit = l[i]; c[m].prob = p; m++;
        sum += p;
    }
    if (sum <= 0.0f || !isfinite(sum)) { free(c); g_fallback = 1; return best; }
    qsort(c, m, sizeof *c, cand_cmp);
    const float min_prob = (c[0].prob / sum) * (min_p > 0.0f ? min_p : 0.0f);
    float kept_sum = 0.0f;
    uint32_t kept = 0;
    for (uint32_t i = 0; i < m; i++) {
        const float p = c[i].prob / sum;
        if (i > 0 && p < min_prob) break;
        kept_sum += c[i].prob;
        kept++;
        if (kept_sum / sum >= top_p) break;
    }
    float r = rng_f32(rng) * kept_sum;
    for (uint32_t i = 0; i < kept; i++) {
        r -= c[i].prob;
        if (r <= 0.0f) { int id = c[i].id; free(c); return id; }
    }
    int id = c[kept - 1].id;
    free(c);
    return id;
}

static int sample_law(const float *l, uint32_t n, float t, int top_k, float top_p, float min_p,
                      uint64_t *rng) {
    if (t <= 0.0f) return sample_argmax(l, n);
    if (top_p <= 0.0f || top_p > 1.0f) top_p = 1.0f;
    if (min_p < 0.0f) min_p = 0.0f;
    if (top_k <= 0) return full_vocab(l, n, t, top_p, min_p, rng);
    if (top_k > 1024) top_k = 1024;
    if ((uint32_t)top_k > n) top_k = (int)n;
    int ids[1024];
    float vals[1024];
    int k = 0;
    for (uint32_t i = 0; i < n; i++) {
        const float v = l[i];
        if (!isfinite(v)) continue;
        if (k == top_k && v <= vals[k - 1]) continue;
        int j = k < top_k ? k++ : k - 1;
        while (j > 0 && vals[j - 1] < v) { vals[j] = vals[j - 1]; ids[j] = ids[j - 1]; j--; }
        vals[j] = v;
        ids[j] = (int)i;
    }
    if (k == 0) { g_fallback = 1; return sample_argmax(l, n); }
    float probs[1024];
    const float max_logit = vals[0];
    float sum = 0.0f;
    for (int i = 0; i < k; i++) { probs[i] = expf((vals[i] - max_logit) / t); sum += probs[i]; }
    if (sum <= 0.0f || !isfinite(sum)) { g_fallback = 1; return ids[0]; }
    const float min_prob = (probs[0] / sum) * min_p;
    float kept_sum = 0.0f;
    int kept = 0;
    for (int i = 0; i < k; i++) {
        const float p = probs[i] / sum;
        if (i > 0 && p < min_prob) break;
        kept_sum += probs[i];
        kept++;
        if (kept_sum / sum >= top_p) break;
    }
    float r = rng_f32(rng) * kept_sum;
    for (int i = 0; i < kept; i++) {
        r -= probs[i];
        if (r <= 0.0f) return ids[i];
    }
    return ids[kept - 1];
}

int main(void) {
    char mode[16];
    while (scanf("%15s", mode) == 1) {
        if (strcmp(mode, "stream") == 0) {
            uint64_t seed, count;
            if (scanf("%" SCNu64 " %" SCNu64, &seed, &count) != 2) return 2;
            uint64_t a = seed, b = seed;
            for (uint64_t i = 0; i < count; i++) {
                uint64_t out = rng_next(&a);
                float u = rng_f32(&b);
                uint32_t bits;
                memcpy(&bits, &u, sizeof bits);
                printf("%016" PRIx64 " %08" PRIx32 "\n", out, bits);
            }
        } else if (strcmp(mode, "case") == 0) {
            uint32_t n;
            double t, top_p, min_p;
            int top_k;
            uint64_t seed, draws;
            if (scanf("%" SCNu32 " %lf %d %lf %lf %" SCNu64 " %" SCNu64, &n, &t, &top_k, &top_p,
                      &min_p, &seed, &draws) != 7)
                return 2;
            float *l = malloc((size_t)n * sizeof *l);
            if (!l) return 2;
            for (uint32_t i = 0; i < n; i++) {
                uint32_t bits;
                if (scanf("%" SCNx32, &bits) != 1) return 2;
                memcpy(&l[i], &bits, sizeof bits);
            }
            g_draws = 0;
            g_fallback = 0;
            uint64_t state = seed;
            for (uint64_t d = 0; d < draws; d++) {
                int tok = sample_law(l, n, (float)t, top_k, (float)top_p, (float)min_p, &state);
                printf("%d ", tok);
            }
            printf("; %" PRIu64 " %d\n", g_draws, g_fallback);
            free(l);
        } else {
            fprintf(stderr, "unknown mode %s\n", mode);
            return 2;
        }
    }
    return 0;
}
