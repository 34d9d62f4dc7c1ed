// Synthetic Q4_1 weights generated on the device (`load::synthetic`): block
// b's GGUF quants are SplitMix64 outputs 2b and 2b + 1 of the tensor's
// stream, little-endian (the GPU's byte order, so the bytes are the
// host's), stored in the device's quarter-word order (`weights.rs`,
// `repack`); every block has the same scale and minimum word `dm_word`
// (f16 d | f16 m << 16).

__device__ __forceinline__ u64 synth_hash(u64 seed, u64 i) {
    u64 z = seed + (i + 1) * 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

extern "C" __global__ void synth_q4_1(u32* dm, u8* quants, u64 blocks, u64 seed, u32 dm_word) {
    dep_entry();
    FOR_EACH(b, blocks) {
        dm[b] = dm_word;
        u64 g[2] = {synth_hash(seed, 2 * b), synth_hash(seed, 2 * b + 1)};
        u32* q = (u32*)(quants + b * 16);
        // Quarter r: the low (r < 2) or high nibbles of GGUF bytes
        // 8·(r % 2) .. + 8, element i of the quarter in bits 4i.
        for (int r = 0; r < 4; r++) {
            u64 bytes = g[r & 1];
            u32 word = 0;
            for (int i = 0; i < 8; i++) word |= (u32)((bytes >> (8 * i + 4 * (r >> 1))) & 0xf) << (4 * i);
            q[r] = word;
        }
    }
}
