//! xorshift64* stream of the ds4 law (antirez/ds4 `sample_rng_next`).
//!
//! No seed mixing: the request seed *is* the initial state. A zero state is
//! replaced by the golden-ratio constant at each step (xorshift would stay at
//! zero forever), which is also what ds4 does.

/// Replacement for a zero state.
const ZERO_GUARD: u64 = 0x9e37_79b9_7f4a_7c15;
/// Output multiplier of xorshift64*.
const OUT_MULT: u64 = 0x2545_F491_4F6C_DD1D;

/// Vigna's xorshift64* with ds4's 24-bit f32 uniform.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct XorShift64Star {
    state: u64,
}

impl XorShift64Star {
    /// A stream whose initial state is `state` (0 is legal: see the guard).
    pub const fn new(state: u64) -> Self {
        Self { state }
    }

    /// Current state (what a request would persist between tokens).
    pub const fn state(&self) -> u64 {
        self.state
    }

    /// Advance and return the scrambled output.
    pub fn next_u64(&mut self) -> u64 {
        let mut x = if self.state == 0 {
            ZERO_GUARD
        } else {
            self.state
        };
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.state = x;
        x.wrapping_mul(OUT_MULT)
    }

    /// `((out >> 40) & 0xFFFFFF) / 2^24` in f32: 24 bits, exact in f32, in [0, 1).
    pub fn uniform_f32(&mut self) -> f32 {
        ((self.next_u64() >> 40) & 0xFF_FFFF) as f32 / 16_777_216.0
    }
}
