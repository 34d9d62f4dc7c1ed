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
// Experts per lane the softmax router keeps in registers (32 · 16 = 512).
#define ROUTE_REG 16

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
        if (n_exp <= 32 * ROUTE_REG) {
            // Up to 512 experts: each lane loads its logits once (all in
            // flight together) and keeps them, their exps and ranking keys
            // in registers with a taken mask, instead of three passes over
            // memory and k passes that each recompute every exp and scan
            // the chosen list. The same values in the same order with the
            // same comparisons as `warp_argbest`, so the same experts and
            // bits.
            float pv[ROUTE_REG];
#pragma unroll
            for (int j = 0; j < ROUTE_REG; j++) {
                u64 e = lane + 32 * (u64)j;
                pv[j] = e < n_exp ? x[e] : DS4_NEG_INF;
            }
            float mx = DS4_NEG_INF;
#pragma unroll
            for (int j = 0; j < ROUTE_REG; j++) mx = fmaxf(mx, pv[j]);
            mx = warp_max(mx);
            float part = 0.0f;
            u32 keys[ROUTE_REG];
#pragma unroll
            for (int j = 0; j < ROUTE_REG; j++) {
                u64 e = lane + 32 * (u64)j;
                if (e < n_exp) {
                    pv[j] = expf(pv[j] - mx);
                    part += pv[j];
                    keys[j] = total_key(pv[j]);
                } else {
                    pv[j] = 0.0f;
                    keys[j] = 0;
                }
            }
            sum = warp_sum(part);
            u32 taken = 0;
            for (int s = 0; s < k; s++) {
                u32 best = 0, bi = 0xffffffffu;
#pragma unroll
                for (int j = 0; j < ROUTE_REG; j++) {
                    u32 e = lane + 32 * j;
                    if (e >= n_exp || ((taken >> j) & 1u)) continue;
                    if (bi == 0xffffffffu || ranks_before(keys[j], e, best, bi)) {
                        best = keys[j];
                        bi = e;
                    }
                }
                if (bi == 0xffffffffu) best = 0;
                for (int o = 16; o > 0; o >>= 1) {
                    u32 k2 = __shfl_xor_sync(FULL_MASK, best, o);
                    u32 i2 = __shfl_xor_sync(FULL_MASK, bi, o);
                    bool better =
                        i2 != 0xffffffffu && (bi == 0xffffffffu || ranks_before(k2, i2, best, bi));
                    if (better) {
                        best = k2;
                        bi = i2;
                    }
                }
                chosen[s] = bi;
                if (bi != 0xffffffffu && (bi & 31u) == lane) taken |= 1u << (bi >> 5);
                // The chosen expert's p from the lane that holds it.
                float mine = 0.0f;
#pragma unroll
                for (int j = 0; j < ROUTE_REG; j++)
                    if ((u32)j == (bi >> 5)) mine = pv[j];
                top[s] = __shfl_sync(FULL_MASK, mine, bi & 31u) / sum;
            }
        } else {
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

// Scored routing (`cpu::routing::route_scored`), one warp per row. groups
// = 0: no group limit; fixed: hash routing (experts given per token).
// `masked` is the choice value of experts in dropped groups.
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
            for (int s = 0; s < k; s++)
                chosen[s] = warp_argbest(0, n_exp, masked_choice,
                                         [&](u32 e) { return chosen_has(chosen, s, e); });
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
