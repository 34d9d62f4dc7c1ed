// Selections: exact top-k of score rows (radix select on the total order,
// ties to the lower index) and the MoE routers, each row alone.

#define TOPK_THREADS 256

// Per row r: the min(k, n_r) best of scores[r·stride + 0 .. n_r), in
// ascending index order, each expanded to `ratio` entries j·ratio + 0 ..
// ratio, then the tail n_r·ratio .. visible_r. out: [rows, cap].
//
// The k-th best key is found by four 8-bit radix passes (integer histograms:
// exact whatever the order of the atomics), then every key above it is
// taken and, of the keys equal to it, the lowest indices. One block per row.
extern "C" __global__ void topk_select(u32* out, u32* counts, const float* scores, u64 stride,
                                       const u32* limits, const u32* visible, u32 k, u32 ratio,
                                       u64 cap) {
    dep_entry();
    __shared__ u32 hist[256];
    __shared__ u32 pre_gt[TOPK_THREADS + 1], pre_eq[TOPK_THREADS + 1];
    __shared__ u32 sh_prefix, sh_remaining;
    u64 r = blockIdx.x;
    unsigned tid = threadIdx.x;
    u32 n = limits[r];
    u32 kk = k < n ? k : n;
    const float* sr = scores + r * stride;
    // all: every key is taken; threshold/remaining otherwise.
    bool all = kk == n;
    u32 thr = 0xffffffffu, rem = 0;
    if (!all && kk > 0) {
        u32 prefix = 0, mask = 0, remaining = kk;
        for (int shift = 24; shift >= 0; shift -= 8) {
            for (u32 b = tid; b < 256; b += blockDim.x) hist[b] = 0;
            __syncthreads();
            for (u32 i = tid; i < n; i += blockDim.x) {
                u32 key = total_key(sr[i]);
                if ((key & mask) == prefix) atomicAdd(&hist[(key >> shift) & 255], 1u);
            }
            __syncthreads();
            if (tid == 0) {
                u32 cum = 0, sel = 0;
                for (int b = 255; b >= 0; b--) {
                    if (cum + hist[b] >= remaining) {
                        sel = (u32)b;
                        break;
                    }
                    cum += hist[b];
                }
                sh_prefix = prefix | (sel << shift);
                sh_remaining = remaining - cum;
            }
            __syncthreads();
            prefix = sh_prefix;
            remaining = sh_remaining;
            mask |= 255u << shift;
            __syncthreads();
        }
        thr = prefix;
        rem = remaining;
    }
    // Contiguous chunks per thread, so outputs come out in index order.
    u32 chunk = (n + blockDim.x - 1) / blockDim.x;
    u32 lo = tid * chunk < n ? tid * chunk : n;
    u32 hi = lo + chunk < n ? lo + chunk : n;
    u32 gt = 0, eq = 0;
    if (!all && kk > 0)
        for (u32 i = lo; i < hi; i++) {
            u32 key = total_key(sr[i]);
            gt += key > thr;
            eq += key == thr;
        }
    pre_gt[tid] = gt;
    pre_eq[tid] = eq;
    __syncthreads();
    if (tid == 0) {
        u32 a = 0, b = 0;
        for (u32 t = 0; t < blockDim.x; t++) {
            u32 x = pre_gt[t], y = pre_eq[t];
            pre_gt[t] = a;
            pre_eq[t] = b;
            a += x;
            b += y;
        }
    }
    __syncthreads();
    u32* o = out + r * cap;
    if (kk > 0) {
        u32 eq_before = pre_eq[tid];
        u32 pos = all ? lo : pre_gt[tid] + (eq_before < rem ? eq_before : rem);
        for (u32 i = lo; i < hi; i++) {
            bool take = all;
            if (!all) {
                u32 key = total_key(sr[i]);
                if (key > thr) take = true;
                else if (key == thr) take = eq_before++ < rem;
            }
            if (take) {
                for (u32 t = 0; t < ratio; t++) o[(u64)pos * ratio + t] = i * ratio + t;
                pos++;
            }
        }
    }
    u32 vis = visible[r];
    u32 tail_first = n * ratio;
    for (u32 t = tid; tail_first + t < vis; t += blockDim.x) o[(u64)kk * ratio + t] = tail_first + t;
    if (tid == 0) counts[r] = kk * ratio + (vis > tail_first ? vis - tail_first : 0);
}

#define ROUTE_MAX_K 64
#define ROUTE_MAX_GROUPS 64

__device__ __forceinline__ bool chosen_has(const u32* chosen, int n, u32 e) {
    for (int i = 0; i < n; i++)
        if (chosen[i] == e) return true;
    return false;
}

__device__ __forceinline__ float route_score(float x, int sigmoid) {
    if (sigmoid) return 1.0f / (1.0f + expf(-x));
    return sqrtf(x > 20.0f ? x : log1pf(expf(x)));
}

// Best unchosen expert of [lo, hi) by `value` (ties: lower index), over
// the warp; `skip` rejects candidates.
template <typename F, typename S>
__device__ __forceinline__ u32 warp_argbest(u64 lo, u64 hi, F value, S skip) {
    unsigned lane = threadIdx.x & 31;
    u32 best = 0, bi = 0xffffffffu;
    for (u64 e = lo + lane; e < hi; e += 32) {
        if (skip((u32)e)) continue;
        u32 key = total_key(value((u32)e));
        if (bi == 0xffffffffu || ranks_before(key, (u32)e, best, bi)) {
            best = key;
            bi = (u32)e;
        }
    }
    // Lanes without a candidate lose to every real one.
    if (bi == 0xffffffffu) best = 0;
    for (int o = 16; o > 0; o >>= 1) {
        u32 k2 = __shfl_xor_sync(FULL_MASK, best, o);
        u32 i2 = __shfl_xor_sync(FULL_MASK, bi, o);
        bool better = i2 != 0xffffffffu && (bi == 0xffffffffu || ranks_before(k2, i2, best, bi));
        if (better) {
            best = k2;
            bi = i2;
        }
    }
    return bi;
}

// Softmax routing, one warp per row: p = exp(x − max), Σ p (lanes over
// experts ≡ lane mod 32 in order, then the butterfly), the k most probable
// (ties: lower index), weights p/Σ, renormalised by their sum in slot order.
// Rows of more experts than `route_softmax_topk_block_f32` keeps.
extern "C" __global__ void route_softmax_topk_f32(u32* experts, float* weights,
                                                  const float* logits, u64 rows, u64 n_exp,
                                                  int k, int renormalise) {
    dep_entry();
    unsigned lane = threadIdx.x & 31;
    for (u64 r = (u64)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32; r < rows;
         r += (u64)gridDim.x * (blockDim.x / 32)) {
        const float* x = logits + r * n_exp;
        u32 chosen[ROUTE_MAX_K];
        float top[ROUTE_MAX_K];
        float sum;
        float mx = DS4_NEG_INF;
        for (u64 e = lane; e < n_exp; e += 32) mx = fmaxf(mx, x[e]);
        mx = warp_max(mx);
        float part = 0.0f;
        for (u64 e = lane; e < n_exp; e += 32) part += expf(x[e] - mx);
        sum = warp_sum(part);
        auto p = [&](u32 e) { return expf(x[e] - mx); };
        for (int s = 0; s < k; s++) {
            chosen[s] =
                warp_argbest(0, n_exp, p, [&](u32 e) { return chosen_has(chosen, s, e); });
            top[s] = p(chosen[s]) / sum;
        }
        float norm = 1.0f;
        if (renormalise) {
            norm = -0.0f;
            for (int s = 0; s < k; s++) norm += top[s];
        }
        if (lane == 0)
            for (int s = 0; s < k; s++) {
                experts[r * k + s] = chosen[s];
                weights[r * k + s] = top[s] / norm;
            }
    }
}

// Threads of `route_softmax_topk_block_f32` and the experts each keeps.
#define ROUTE_THREADS 128
#define ROUTE_PER 4

// The block routers' two stages (`route_softmax_topk_block_f32`,
// `route_scored_block_f32`). First, this warp's k best of the experts its
// lanes keep (`keys[j]`: expert lane + 32·(ROUTE_PER·warp + j); fewer when
// it holds fewer experts) into candidates warp·k + s: each round, the
// largest key of the lanes' best open experts (a lane's own in index order,
// so its first of equal keys), then the lowest index holding it, two warp
// reductions.
__device__ __forceinline__ void route_warp_best(const u32 (&keys)[ROUTE_PER], u64 n_exp, int k,
                                                u32* ckey, u32* cidx) {
    unsigned lane = threadIdx.x & 31, warp = threadIdx.x / 32;
    u32 taken = 0;
    for (int s = 0; s < k; s++) {
        u32 best = 0, bi = 0xffffffffu;
#pragma unroll
        for (int j = 0; j < ROUTE_PER; j++) {
            u32 e = lane + 32 * (ROUTE_PER * warp + j);
            bool open = e < n_exp && !((taken >> j) & 1u);
            if (open && (bi == 0xffffffffu || keys[j] > best)) {
                best = keys[j];
                bi = e;
            }
        }
        u32 top = __reduce_max_sync(FULL_MASK, bi == 0xffffffffu ? 0u : best);
        u32 win = __reduce_min_sync(FULL_MASK, bi != 0xffffffffu && best == top ? bi : 0xffffffffu);
        if (win != 0xffffffffu && (win & 31u) == lane) taken |= 1u << ((win >> 5) % ROUTE_PER);
        if (lane == 0) {
            ckey[warp * k + s] = top;
            cidx[warp * k + s] = win;
        }
    }
}

// Then (after a barrier) each of the `nc` candidates counts those ranked
// before it, which is its slot when below k: every expert ranked before one
// of the k best is itself one of its warp's k best, so the count is its
// rank overall.
__device__ __forceinline__ void route_rank_candidates(const u32* ckey, const u32* cidx, u32 nc,
                                                      int k, u32* slot) {
    for (u32 c = threadIdx.x; c < nc; c += ROUTE_THREADS) {
        u32 ic = cidx[c], kc = ckey[c], before = 0;
        if (ic == 0xffffffffu) continue;
        for (u32 o = 0; o < nc; o++)
            before += cidx[o] != 0xffffffffu && ranks_before(ckey[o], cidx[o], kc, ic);
        if (before < (u32)k) slot[before] = ic;
    }
}

// `route_softmax_topk_f32` for up to ROUTE_THREADS · ROUTE_PER experts, a
// block per row, with its bits: the max is exact in any order, each p is
// the same expf of the same difference, warp 0 sums the p as the warp
// kernel does (lane l: experts l, l + 32, … in order, then the butterfly),
// and the k best under the strict order (larger p, then lower index) are
// one list however they are found; the weights and their renormalisation
// are the same sequence. Found in two stages instead of k rounds over every
// expert (a decode step's one row ran 13 µs as one warp, run 20): each warp
// takes the k best of its experts (k rounds of two warp reductions over
// ROUTE_PER a lane), then each of these candidates counts the candidates
// ranked before it, which is its slot when below k (every expert ranked
// before one of the k best is itself one of its warp's k best, so the
// count is its rank overall).
extern "C" __global__ void route_softmax_topk_block_f32(u32* experts, float* weights,
                                                        const float* logits, u64 rows,
                                                        u64 n_exp, int k, int renormalise) {
    dep_entry();
    const int warps = ROUTE_THREADS / 32;
    __shared__ float sp[ROUTE_THREADS * ROUTE_PER];
    __shared__ float wmax[ROUTE_THREADS / 32];
    __shared__ u32 ckey[(ROUTE_THREADS / 32) * ROUTE_MAX_K];
    __shared__ u32 cidx[(ROUTE_THREADS / 32) * ROUTE_MAX_K];
    __shared__ u32 slot[ROUTE_MAX_K];
    __shared__ float top_p[ROUTE_MAX_K];
    __shared__ float sh_sum, sh_norm;
    unsigned tid = threadIdx.x, lane = tid & 31, warp = tid / 32;
    for (u64 r = blockIdx.x; r < rows; r += gridDim.x) {
        const float* x = logits + r * n_exp;
        // Thread (warp w, lane l) keeps experts l + 32·(ROUTE_PER·w + j).
        float pv[ROUTE_PER];
        u32 keys[ROUTE_PER];
        float mx = DS4_NEG_INF;
#pragma unroll
        for (int j = 0; j < ROUTE_PER; j++) {
            u32 e = lane + 32 * (ROUTE_PER * warp + j);
            pv[j] = e < n_exp ? x[e] : DS4_NEG_INF;
            mx = fmaxf(mx, pv[j]);
        }
        mx = warp_max(mx);
        if (lane == 0) wmax[warp] = mx;
        __syncthreads();
        mx = wmax[0];
        for (int w = 1; w < warps; w++) mx = fmaxf(mx, wmax[w]);
#pragma unroll
        for (int j = 0; j < ROUTE_PER; j++) {
            u32 e = lane + 32 * (ROUTE_PER * warp + j);
            keys[j] = 0;
            if (e < n_exp) {
                pv[j] = expf(pv[j] - mx);
                keys[j] = total_key(pv[j]);
                sp[e] = pv[j];
            }
        }
        route_warp_best(keys, n_exp, k, ckey, cidx);
        __syncthreads();
        if (warp == 0) {
            float part = 0.0f;
            for (u64 e = lane; e < n_exp; e += 32) part += sp[e];
            float total = warp_sum(part);
            if (lane == 0) sh_sum = total;
        }
        route_rank_candidates(ckey, cidx, (u32)(warps * k), k, slot);
        __syncthreads();
        // p/Σ of each slot, their sum in slot order from -0, each weight.
        if (tid < (unsigned)k) top_p[tid] = sp[slot[tid]] / sh_sum;
        __syncthreads();
        if (tid == 0) {
            float norm = 1.0f;
            if (renormalise) {
                norm = -0.0f;
                for (int s = 0; s < k; s++) norm += top_p[s];
            }
            sh_norm = norm;
        }
        __syncthreads();
        if (tid < (unsigned)k) {
            experts[r * k + tid] = slot[tid];
            weights[r * k + tid] = top_p[tid] / sh_norm;
        }
        // The next row reuses the shared arrays.
        __syncthreads();
    }
}

// Scored routing (`cpu::routing::route_scored`), one warp per row. groups
// = 0: no group limit; fixed: hash routing (experts given per token).
// `masked` is the choice value of experts in dropped groups.
// Candidates a lane keeps scored in `route_scored_f32` (experts ≤ 32 × this).
#define ROUTE_CACHE 16
extern "C" __global__ void route_scored_f32(u32* experts, float* weights, const float* logits,
                                            const float* bias, const u32* fixed, u64 rows,
                                            u64 n_exp, int k, int sigmoid, int groups,
                                            int keep, int renormalise, float scale,
                                            float masked) {
    dep_entry();
    unsigned lane = threadIdx.x & 31;
    for (u64 r = (u64)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32; r < rows;
         r += (u64)gridDim.x * (blockDim.x / 32)) {
        const float* x = logits + r * n_exp;
        auto score = [&](u32 e) { return route_score(x[e], sigmoid); };
        auto choice = [&](u32 e) { return bias ? score(e) + bias[e] : score(e); };
        u32 chosen[ROUTE_MAX_K];
        if (fixed) {
            for (int s = 0; s < k; s++) chosen[s] = fixed[r * k + s];
        } else {
            bool kept[ROUTE_MAX_GROUPS];
            u64 per = groups > 0 ? n_exp / groups : n_exp;
            if (groups > 0) {
                float gscore[ROUTE_MAX_GROUPS];
                for (int g = 0; g < groups; g++) {
                    u64 lo = (u64)g * per, hi = lo + per;
                    u32 b0 = warp_argbest(lo, hi, choice, [](u32) { return false; });
                    float gs = 0.0f + choice(b0);
                    if (per > 1) {
                        u32 b1 = warp_argbest(lo, hi, choice, [&](u32 e) { return e == b0; });
                        gs = gs + choice(b1);
                    }
                    gscore[g] = gs;
                    kept[g] = false;
                }
                for (int i = 0; i < keep; i++) {
                    int bg = -1;
                    for (int g = 0; g < groups; g++) {
                        if (kept[g]) continue;
                        if (bg < 0 || ranks_before(total_key(gscore[g]), g, total_key(gscore[bg]), bg)) bg = g;
                    }
                    if (bg >= 0) kept[bg] = true;
                }
            }
            auto masked_choice = [&](u32 e) {
                return (groups > 0 && !kept[e / per]) ? masked : choice(e);
            };
            if (n_exp <= 32 * ROUTE_CACHE) {
                // Each lane's candidates (e ≡ lane mod 32, as `warp_argbest`
                // walks them from 0) scored once, not once a pick: run 31
                // had this kernel at 25 µs a row recomputing 256 scores for
                // each of 6 picks. The same values, so the same choices.
                float cached[ROUTE_CACHE];
#pragma unroll
                for (int i = 0; i < ROUTE_CACHE; i++) {
                    u64 e = lane + 32 * (u64)i;
                    cached[i] = e < n_exp ? masked_choice((u32)e) : 0.0f;
                }
                auto cached_choice = [&](u32 e) { return cached[(e - lane) / 32]; };
                for (int s = 0; s < k; s++)
                    chosen[s] = warp_argbest(0, n_exp, cached_choice,
                                             [&](u32 e) { return chosen_has(chosen, s, e); });
            } else {
                for (int s = 0; s < k; s++)
                    chosen[s] = warp_argbest(0, n_exp, masked_choice,
                                             [&](u32 e) { return chosen_has(chosen, s, e); });
            }
        }
        float denom = 1.0f;
        if (renormalise) {
            float sum = 0.0f;
            for (int s = 0; s < k; s++) sum += score(chosen[s]);
            denom = sum + 1e-20f;
        }
        if (lane == 0)
            for (int s = 0; s < k; s++) {
                experts[r * k + s] = chosen[s];
                weights[r * k + s] = score(chosen[s]) / denom * scale;
            }
    }
}

// `route_scored_f32` without groups or fixed experts, for up to
// ROUTE_THREADS · ROUTE_PER experts, a block per row, with its bits: each
// choice value is the same `route_score` (+ bias) of the same logit, the k
// best under the strict order (larger value, then lower index) are one
// list however they are found (two stages, as `route_softmax_topk_block_f32`
// finds them), and the weights are the same sequence (the chosen scores
// summed in slot order from +0, + 1e-20, each score / that · scale). Run
// 37's DeepSeek-V4 decode step had the warp kernel at 23 µs a layer (one
// warp walking 256 experts for each of 6 picks).
extern "C" __global__ void route_scored_block_f32(u32* experts, float* weights,
                                                  const float* logits, const float* bias,
                                                  u64 rows, u64 n_exp, int k, int sigmoid,
                                                  int renormalise, float scale) {
    dep_entry();
    __shared__ u32 ckey[(ROUTE_THREADS / 32) * ROUTE_MAX_K];
    __shared__ u32 cidx[(ROUTE_THREADS / 32) * ROUTE_MAX_K];
    __shared__ u32 slot[ROUTE_MAX_K];
    const int warps = ROUTE_THREADS / 32;
    unsigned tid = threadIdx.x, lane = tid & 31, warp = tid / 32;
    for (u64 r = blockIdx.x; r < rows; r += gridDim.x) {
        const float* x = logits + r * n_exp;
        // Thread (warp w, lane l) keeps experts l + 32·(ROUTE_PER·w + j).
        u32 keys[ROUTE_PER];
#pragma unroll
        for (int j = 0; j < ROUTE_PER; j++) {
            u32 e = lane + 32 * (ROUTE_PER * warp + j);
            keys[j] = 0;
            if (e < n_exp) {
                float c = route_score(x[e], sigmoid);
                if (bias) c = c + bias[e];
                keys[j] = total_key(c);
            }
        }
        route_warp_best(keys, n_exp, k, ckey, cidx);
        __syncthreads();
        route_rank_candidates(ckey, cidx, (u32)(warps * k), k, slot);
        __syncthreads();
        if (tid == 0) {
            float denom = 1.0f;
            if (renormalise) {
                float sum = 0.0f;
                for (int s = 0; s < k; s++) sum += route_score(x[slot[s]], sigmoid);
                denom = sum + 1e-20f;
            }
            for (int s = 0; s < k; s++) {
                experts[r * k + s] = slot[s];
                weights[r * k + s] = route_score(x[slot[s]], sigmoid) / denom * scale;
            }
        }
        // The next row reuses the shared arrays.
        __syncthreads();
    }
}

// Pools of `pool` tokens to tokens (GLM-5's DSA): row r (token t = base +
// r) lists the tokens of each selected pool in order, then with `tail` the
// incomplete tail ⌊(t+1)/pool⌋·pool ..= t. One thread per output slot.
extern "C" __global__ void expand_pools(u32* out, u32* out_counts, const u32* idx,
                                        const u32* counts, u64 cap, u64 rows, u64 base,
                                        u64 pool, int tail, u64 out_cap) {
    dep_entry();
    FOR_EACH(s, rows * out_cap) {
        u64 r = s / out_cap, i = s % out_cap;
        u64 t = base + r;
        u64 c = counts[r];
        u64 complete = (t + 1) / pool;
        u64 tail_n = tail ? t + 1 - complete * pool : 0;
        if (i == 0) out_counts[r] = (u32)(c * pool + tail_n);
        if (i < c * pool)
            out[s] = (u32)((u64)idx[r * cap + i / pool] * pool + i % pool);
        else if (i < c * pool + tail_n)
            out[s] = (u32)(complete * pool + (i - c * pool));
    }
}
