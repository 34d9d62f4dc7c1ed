//! Random streams. Each request owns one; it advances only when a law takes
//! a draw, so the number of draws is part of a law's observable behaviour.

mod pcg64;
mod xorshift;

pub use pcg64::NumpyPcg64;
pub use xorshift::XorShift64Star;
