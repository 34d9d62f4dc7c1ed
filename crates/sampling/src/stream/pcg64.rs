//! NumPy-compatible PCG64 stream: `numpy.random.default_rng(seed)`.
//!
//! NumPy builds its default generator as `Generator(PCG64(SeedSequence(seed)))`.
//! Reproducing its draws bit for bit needs three pieces, all ported here:
//! the `SeedSequence` entropy pool and its output hash, the PCG XSL-RR 128/64
//! generator seeded with NumPy's word order, and `Generator.random()`'s
//! 53-bit double. Categorical draws (`Generator.choice(p=...)`) live with the
//! nucleus law, which owns the support order.

/// 128-bit LCG multiplier of PCG64 (`PCG_DEFAULT_MULTIPLIER_128`).
const PCG_MULT: u128 = 0x2360_ED05_1FC6_5DA4_4385_DF64_9FCC_F645;

// SeedSequence constants (numpy/random/bit_generator.pyx).
const INIT_A: u32 = 0x43b0_d7e5;
const MULT_A: u32 = 0x931e_8875;
const INIT_B: u32 = 0x8b51_f9dd;
const MULT_B: u32 = 0x58f3_8ded;
const MIX_MULT_L: u32 = 0xca01_f9dd;
const MIX_MULT_R: u32 = 0x4973_f715;
const XSHIFT: u32 = 16;
/// `SeedSequence.pool_size` default.
const POOL_SIZE: usize = 4;

/// NumPy's `SeedSequence` reduced to what `default_rng(int)` uses: integer
/// entropy, no spawn key, pool of four words.
struct SeedSequence {
    pool: [u32; POOL_SIZE],
}

impl SeedSequence {
    fn from_u64(seed: u64) -> Self {
        // `_int_to_uint32_array`: little-endian u32 words, at least one word
        // (0 becomes [0]). With a pool of four, missing words are hashed as
        // zeros, so [0] and [] give the same pool anyway.
        let entropy: Vec<u32> = if seed >> 32 == 0 {
            vec![seed as u32]
        } else {
            vec![seed as u32, (seed >> 32) as u32]
        };
        let mut hash_const = INIT_A;
        let mut hashmix = |value: u32| -> u32 {
            let mut value = value ^ hash_const;
            hash_const = hash_const.wrapping_mul(MULT_A);
            value = value.wrapping_mul(hash_const);
            value ^ (value >> XSHIFT)
        };
        let mix = |x: u32, y: u32| -> u32 {
            let r = MIX_MULT_L
                .wrapping_mul(x)
                .wrapping_sub(MIX_MULT_R.wrapping_mul(y));
            r ^ (r >> XSHIFT)
        };
        let mut pool = [0u32; POOL_SIZE];
        for (i, slot) in pool.iter_mut().enumerate() {
            *slot = hashmix(entropy.get(i).copied().unwrap_or(0));
        }
        for src in 0..POOL_SIZE {
            for dst in 0..POOL_SIZE {
                if src != dst {
                    let h = hashmix(pool[src]);
                    pool[dst] = mix(pool[dst], h);
                }
            }
        }
        // A u64 seed has at most two words, never more than the pool, so
        // NumPy's "remaining entropy" loop has nothing to do here.
        Self { pool }
    }

    /// `generate_state(n_words, np.uint64)`: 2*n u32 words, paired
    /// little-endian into u64 (NumPy views the u32 array as u64).
    fn generate_state_u64<const N: usize>(&self) -> [u64; N] {
        let mut hash_const = INIT_B;
        let mut words = self.pool.iter().copied().cycle();
        let mut out = [0u64; N];
        for slot in out.iter_mut() {
            let mut pair = [0u32; 2];
            for half in pair.iter_mut() {
                // `cycle()` over a non-empty array never ends.
                let mut v = words.next().unwrap_or_default();
                v ^= hash_const;
                hash_const = hash_const.wrapping_mul(MULT_B);
                v = v.wrapping_mul(hash_const);
                *half = v ^ (v >> XSHIFT);
            }
            *slot = u64::from(pair[0]) | (u64::from(pair[1]) << 32);
        }
        out
    }
}

/// PCG XSL-RR 128/64 seeded exactly as `numpy.random.default_rng(seed)`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NumpyPcg64 {
    state: u128,
    inc: u128,
}

impl NumpyPcg64 {
    /// The stream `numpy.random.default_rng(seed)` produces.
    pub fn from_seed(seed: u64) -> Self {
        let v: [u64; 4] = SeedSequence::from_u64(seed).generate_state_u64();
        // NumPy passes `PCG_128BIT_CONSTANT(v[0], v[1])`: high word first.
        let initstate = (u128::from(v[0]) << 64) | u128::from(v[1]);
        let initseq = (u128::from(v[2]) << 64) | u128::from(v[3]);
        Self::new(initstate, initseq)
    }

    /// `pcg_setseq_128_srandom_r`: the canonical PCG seeding.
    pub fn new(initstate: u128, initseq: u128) -> Self {
        let mut rng = Self {
            state: 0,
            inc: (initseq << 1) | 1,
        };
        rng.step();
        rng.state = rng.state.wrapping_add(initstate);
        rng.step();
        rng
    }

    fn step(&mut self) {
        self.state = self.state.wrapping_mul(PCG_MULT).wrapping_add(self.inc);
    }

    /// Next raw output: step, then XSL-RR of the new state.
    pub fn next_u64(&mut self) -> u64 {
        self.step();
        let hi = (self.state >> 64) as u64;
        let lo = self.state as u64;
        (hi ^ lo).rotate_right((self.state >> 122) as u32)
    }

    /// `Generator.random()`: a double in [0, 1) from the top 53 bits.
    pub fn random(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / 9_007_199_254_740_992.0)
    }
}
