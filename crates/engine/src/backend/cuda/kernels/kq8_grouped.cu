// The fast set's routed K-quant products grouped by expert (`stored.rs`
// `gather`): the (token, slot) pairs of a call sorted by expert into tiles
// of up to KQ_GROUP rows, so that the product (`kq8_mma.cu`, on the tensor
// cores) reads an expert's weight rows once a tile instead of once a pair
// (`kq8_gather_*` reads them per pair, which made a prefill chunk read
// every routed expert ~12 times a layer). Which pairs share a tile changes
// no output's bits. (A warp per output and tile on `dp4a`, this file's
// product until run 36, was 1.8–3.6× slower than the tensor-core tiles at
// every size from 1.5 pairs an expert: removed.)
#ifndef KQ_HOST

// Pairs a tile holds at most (`kq8_mma.cu` runs them as sub-tiles of 8,
// one weight decode for all): a 2,048-token chunk gives each of 256
// experts ~48 pairs.
#define KQ_GROUP 32
// Experts a grouping handles at most (shared counters; `stored.rs` falls
// back to the per-pair gather above it).
#define KQ_GROUP_EXPERTS 1024

// One block: per-expert counts, their starts, the tiles (expert, first
// index into `order`, rows: three words each) in expert order, `*ntiles`,
// and `order` (the pairs of each expert together; within an expert in the
// order the atomics give, which no output depends on).
extern "C" __global__ void kq8_group_pairs(u32* order, u32* tiles, u32* ntiles,
                                           const u32* experts, u64 pairs, u64 e_count) {
    dep_entry();
    __shared__ u32 counts[KQ_GROUP_EXPERTS];
    __shared__ u32 cursor[KQ_GROUP_EXPERTS];
    for (u64 e = threadIdx.x; e < e_count; e += blockDim.x) counts[e] = 0, cursor[e] = 0;
    __syncthreads();
    for (u64 p = threadIdx.x; p < pairs; p += blockDim.x) atomicAdd(&counts[experts[p]], 1u);
    __syncthreads();
    if (threadIdx.x == 0) {
        u32 start = 0, t = 0;
        for (u64 e = 0; e < e_count; e++) {
            u32 c = counts[e];
            for (u32 j = 0; j < c; j += KQ_GROUP) {
                tiles[3 * t] = (u32)e;
                tiles[3 * t + 1] = start + j;
                tiles[3 * t + 2] = c - j < KQ_GROUP ? c - j : KQ_GROUP;
                t++;
            }
            counts[e] = start;  // now the expert's first index
            start += c;
        }
        *ntiles = t;
    }
    __syncthreads();
    for (u64 p = threadIdx.x; p < pairs; p += blockDim.x) {
        u32 e = experts[p];
        order[counts[e] + atomicAdd(&cursor[e], 1u)] = (u32)p;
    }
}

#endif  // KQ_HOST
