//! Rotary position embeddings.
//!
//! `inv_freq[i] = 1 / theta^(2i / head_dim)`, optionally rescaled
//! ([`RopeScaling`]); position `p` rotates pair `i` of every head by
//! `p * inv_freq[i]`. Two pairings exist in the wild:
//! - [`RopeLayout::HalfSplit`] (Hugging Face): pair `(x[i], x[i + d/2])`;
//! - [`RopeLayout::Interleaved`] (GGUF, whose converter permutes the q/k
//!   rows): pair `(x[2i], x[2i + 1])`.
//!
//! The cos/sin tables are computed once for the whole context (f32,
//! `2 * context * head_dim / 2` floats: 2 MB for 8192 × 64), so a decode step
//! only narrows them. Angles are formed as an f32 product `p * inv_freq`,
//! the way transformers does, so positions far into the context round the
//! same way as the reference.

use crate::backend::Backend;
pub use crate::backend::RopeLayout;
use crate::error::{EngineError, Result};

#[derive(Debug, Clone, PartialEq)]
pub enum RopeScaling {
    None,
    /// Position interpolation: every frequency divided by `factor`.
    Linear {
        factor: f64,
    },
    /// Llama 3.1: long wavelengths divided by `factor`, short ones kept, a
    /// smooth blend between (transformers `_compute_llama3_parameters`).
    Llama3 {
        factor: f64,
        low_freq_factor: f64,
        high_freq_factor: f64,
        original_max_position_embeddings: usize,
    },
    /// YaRN (transformers `_compute_yarn_parameters`, `truncate` on): high
    /// frequencies kept, low ones divided by `factor`, a linear ramp between
    /// the correction dims of `beta_fast` and `beta_slow` rotations over
    /// `original_max_position_embeddings`. (The attention factor is the
    /// caller's: DeepSeek-V4's compressed keys force it to 1.)
    Yarn {
        factor: f64,
        original_max_position_embeddings: usize,
        beta_fast: f64,
        beta_slow: f64,
    },
    /// Per-frequency divisors stored in a GGUF `rope_freqs.weight` tensor
    /// (llama.cpp bakes llama3 scaling into it), `[head_dim / 2]`.
    FreqFactors(Vec<f32>),
}

/// The inverse frequencies, `[head_dim / 2]`, in f32 like transformers.
pub fn inv_freq(theta: f64, head_dim: usize, scaling: &RopeScaling) -> Vec<f32> {
    let base = theta as f32;
    let plain = (0..head_dim / 2).map(|i| 1.0f32 / base.powf((2 * i) as f32 / head_dim as f32));
    match scaling {
        RopeScaling::None => plain.collect(),
        RopeScaling::Linear { factor } => plain.map(|f| f / *factor as f32).collect(),
        RopeScaling::FreqFactors(ff) => plain.zip(ff).map(|(f, d)| f / d).collect(),
        RopeScaling::Yarn {
            factor,
            original_max_position_embeddings,
            beta_fast,
            beta_slow,
        } => {
            // Correction dims in f64 (Python floats), floored / ceiled and
            // clamped to [0, dim − 1]; the ramp and frequencies in f32.
            let dim = head_dim as f64;
            let old = *original_max_position_embeddings as f64;
            let correction = |rotations: f64| {
                dim * (old / (rotations * 2.0 * std::f64::consts::PI)).ln() / (2.0 * theta.ln())
            };
            let low = correction(*beta_fast).floor().max(0.0);
            let mut high = correction(*beta_slow).ceil().min(dim - 1.0);
            if low == high {
                high += 0.001;
            }
            let factor = *factor as f32;
            (0..head_dim / 2)
                .map(|i| {
                    let pos_freq = base.powf((2 * i) as f32 / head_dim as f32);
                    let extrapolation = 1.0 / pos_freq;
                    let interpolation = 1.0 / (factor * pos_freq);
                    let ramp =
                        ((i as f32 - low as f32) / (high as f32 - low as f32)).clamp(0.0, 1.0);
                    let keep = 1.0 - ramp;
                    interpolation * (1.0 - keep) + extrapolation * keep
                })
                .collect()
        }
        RopeScaling::Llama3 {
            factor,
            low_freq_factor,
            high_freq_factor,
            original_max_position_embeddings,
        } => {
            let (factor, low, high) = (
                *factor as f32,
                *low_freq_factor as f32,
                *high_freq_factor as f32,
            );
            let old = *original_max_position_embeddings as f32;
            let low_freq_wavelen = old / low;
            let high_freq_wavelen = old / high;
            plain
                .map(|f| {
                    let wavelen = 2.0 * std::f32::consts::PI / f;
                    if wavelen < high_freq_wavelen {
                        f
                    } else if wavelen > low_freq_wavelen {
                        f / factor
                    } else {
                        let smooth = (old / wavelen - low) / (high - low);
                        (1.0 - smooth) * f / factor + smooth * f
                    }
                })
                .collect()
        }
    }
}

/// Precomputed tables for positions `0..max_positions` on the device.
#[derive(Debug)]
pub struct Rope<B: Backend> {
    cos: B::Buf,
    sin: B::Buf,
    half: usize,
    layout: RopeLayout,
    max_positions: usize,
}

impl<B: Backend> Rope<B> {
    pub fn new(
        ops: &B,
        theta: f64,
        head_dim: usize,
        scaling: &RopeScaling,
        layout: RopeLayout,
        max_positions: usize,
    ) -> Result<Self> {
        let inv = inv_freq(theta, head_dim, scaling);
        let half = inv.len();
        let mut cos = Vec::with_capacity(max_positions * half);
        let mut sin = Vec::with_capacity(max_positions * half);
        for p in 0..max_positions {
            for f in &inv {
                let angle = p as f32 * f;
                cos.push(angle.cos());
                sin.push(angle.sin());
            }
        }
        Ok(Self {
            cos: ops.upload(&cos)?,
            sin: ops.upload(&sin)?,
            half,
            layout,
            max_positions,
        })
    }

    pub fn max_positions(&self) -> usize {
        self.max_positions
    }

    /// The tables of positions `offset .. offset + len`.
    pub fn tables(&self, ops: &B, offset: usize, len: usize) -> Result<RopeRows<B>> {
        if offset + len > self.max_positions {
            return Err(EngineError::ContextOverflow {
                needed: offset + len,
                limit: self.max_positions,
            });
        }
        Ok(RopeRows {
            cos: ops.rows(&self.cos, self.half, offset, len)?,
            sin: ops.rows(&self.sin, self.half, offset, len)?,
            half: self.half,
            layout: self.layout,
        })
    }

    /// The tables of several forwards' positions, one after another
    /// (`(offset, len)` each): a batch's rows in one copy of each table.
    pub fn tables_runs(&self, ops: &B, runs: &[(usize, usize)]) -> Result<RopeRows<B>> {
        if let Some(&(offset, len)) = runs.iter().find(|&&(o, l)| o + l > self.max_positions) {
            return Err(EngineError::ContextOverflow {
                needed: offset + len,
                limit: self.max_positions,
            });
        }
        Ok(RopeRows {
            cos: ops.row_runs(&self.cos, self.half, runs)?,
            sin: ops.row_runs(&self.sin, self.half, runs)?,
            half: self.half,
            layout: self.layout,
        })
    }

    /// [`Rope::tables`] of the `len` positions from the step's (the
    /// caller checked `pos + len` against [`Rope::max_positions`]).
    pub fn tables_step(&self, ops: &B, step: &B::Step, len: usize) -> Result<RopeRows<B>> {
        Ok(RopeRows {
            cos: ops.rows_step(&self.cos, self.half, step, len)?,
            sin: ops.rows_step(&self.sin, self.half, step, len)?,
            half: self.half,
            layout: self.layout,
        })
    }
}

/// Per-row cos/sin tables `[rows, half]` for one forward.
#[derive(Debug)]
pub struct RopeRows<B: Backend> {
    pub cos: B::Buf,
    pub sin: B::Buf,
    pub half: usize,
    pub layout: RopeLayout,
}

impl<B: Backend> RopeRows<B> {
    /// These tables' shape with `cos` and `sin` read from other buffers
    /// (a pure unit's copies of them, [`Backend::run_pure`]).
    pub fn on(&self, cos: &B::Buf, sin: &B::Buf) -> Self {
        Self {
            cos: cos.clone(),
            sin: sin.clone(),
            half: self.half,
            layout: self.layout,
        }
    }

    /// Rotate every `head_dim` head of `x: [rows, heads·head_dim]` in place.
    pub fn apply(&self, ops: &B, x: &mut B::Buf, head_dim: usize) -> Result<()> {
        ops.rope(x, head_dim, &self.cos, &self.sin, self.half, self.layout)
    }

    /// Rotate the trailing `rotary` dims of every `head_dim` head
    /// (interleaved pairs; DeepSeek-V4's `[nope | rope]` heads).
    pub fn apply_trailing(
        &self,
        ops: &B,
        x: &mut B::Buf,
        head_dim: usize,
        rotary: usize,
    ) -> Result<()> {
        if 2 * self.half != rotary {
            return Err(EngineError::State(format!(
                "rope tables of {} pairs for {rotary} rotated dims",
                self.half
            )));
        }
        ops.rope(
            x,
            head_dim,
            &self.cos,
            &self.sin,
            self.half,
            RopeLayout::InterleavedTail,
        )
    }
}

/// Partial interleaved M-RoPE over the first `rotary_dim` dims (Qwen): a
/// frequency `i` takes the h position when `i ≡ 1 (mod 3)` and `i <
/// 3·section[1]`, the w position when `i ≡ 2 (mod 3)` and `i <
/// 3·section[2]`, else t (the interleaved layout; transformers ignores
/// `mrope_interleaved`). `inv_freq_i = θ^(−2i/R)` in f64, rounded to f32.
/// Text tokens have t = h = w.
/// Rotary frequencies whose tables are made per call for the positions
/// asked (no context-sized table: DeepSeek-V4 allows 1M positions), with an
/// optional attention factor on cos and sin and the inverse rotation.
#[derive(Debug, Clone)]
pub struct RopeFreqs {
    inv_freq: Vec<f32>,
    scale: f32,
    layout: RopeLayout,
}

impl RopeFreqs {
    /// `rotary_dim` rotated dims (`inv_freq` over them), `scale` multiplying
    /// cos and sin (1 unless YaRN's attention factor says otherwise).
    pub fn new(
        theta: f64,
        rotary_dim: usize,
        scaling: &RopeScaling,
        scale: f32,
        layout: RopeLayout,
    ) -> Self {
        Self {
            inv_freq: inv_freq(theta, rotary_dim, scaling),
            scale,
            layout,
        }
    }

    /// Tables for `positions` (angles `p·inv_freq` in f32, as transformers
    /// forms them); `inverse` negates sin (the rotation by `−p`).
    pub fn tables<B: Backend>(
        &self,
        ops: &B,
        positions: impl IntoIterator<Item = usize>,
        inverse: bool,
    ) -> Result<RopeRows<B>> {
        let half = self.inv_freq.len();
        let mut cos = Vec::new();
        let mut sin = Vec::new();
        for p in positions {
            for f in &self.inv_freq {
                let (s, c) = (p as f32 * f).sin_cos();
                cos.push(c * self.scale);
                sin.push(if inverse {
                    -(s * self.scale)
                } else {
                    s * self.scale
                });
            }
        }
        Ok(RopeRows {
            cos: ops.upload(&cos)?,
            sin: ops.upload(&sin)?,
            half,
            layout: self.layout,
        })
    }
}

#[derive(Debug, Clone)]
pub struct MRope {
    inv_freq: Vec<f32>,
    /// Which of (t, h, w) drives each frequency.
    axis: Vec<usize>,
    pub rotary_dim: usize,
}

impl MRope {
    pub fn new(theta: f64, rotary_dim: usize, section: [usize; 3]) -> Self {
        let half = rotary_dim / 2;
        // transformers: 1 / base^(arange(0, R, 2) / R) in f32.
        let inv_freq = (0..half)
            .map(|i| (1.0 / theta.powf((2 * i) as f64 / rotary_dim as f64)) as f32)
            .collect();
        let axis = (0..half)
            .map(|i| {
                if i % 3 == 1 && i < 3 * section[1] {
                    1
                } else if i % 3 == 2 && i < 3 * section[2] {
                    2
                } else {
                    0
                }
            })
            .collect();
        Self {
            inv_freq,
            axis,
            rotary_dim,
        }
    }

    /// The tables of `positions` (one row each): angle `pos[axis_i] as f32
    /// · inv_freq_i`, half-split pairs.
    pub fn tables<B: Backend>(&self, ops: &B, positions: &[[u32; 3]]) -> Result<RopeRows<B>> {
        let half = self.rotary_dim / 2;
        let mut cos = Vec::with_capacity(positions.len() * half);
        let mut sin = Vec::with_capacity(positions.len() * half);
        for pos in positions {
            for i in 0..half {
                let f = pos[self.axis[i]] as f32 * self.inv_freq[i];
                let (s, c) = f.sin_cos();
                cos.push(c);
                sin.push(s);
            }
        }
        Ok(RopeRows {
            cos: ops.upload(&cos)?,
            sin: ops.upload(&sin)?,
            half,
            layout: RopeLayout::HalfSplit,
        })
    }
}

/// Rotary tables for arbitrary positions (M-RoPE, YaRN, plain).
pub trait PositionTables<B: Backend> {
    fn tables(&self, ops: &B, positions: &[[u32; 3]]) -> Result<RopeRows<B>>;
}

impl<B: Backend> PositionTables<B> for MRope {
    fn tables(&self, ops: &B, positions: &[[u32; 3]]) -> Result<RopeRows<B>> {
        MRope::tables(self, ops, positions)
    }
}

/// The position inputs of one forward of a layer: the (t, h, w) position of
/// every cached token plus the new ones, the rotary scheme, and the new
/// rows' tables (computed once per forward, shared by every layer).
pub struct Positions<'a, B: Backend, R> {
    pub all: &'a [[u32; 3]],
    pub rope: &'a R,
    pub rows: &'a RopeRows<B>,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// YaRN keeps the highest frequencies, divides the lowest by the
    /// factor, and blends monotonically between the correction dims.
    #[test]
    fn yarn_keeps_high_divides_low_and_ramps_between() {
        let plain = inv_freq(10_000.0, 64, &RopeScaling::None);
        let yarn = inv_freq(
            10_000.0,
            64,
            &RopeScaling::Yarn {
                factor: 16.0,
                original_max_position_embeddings: 4096,
                beta_fast: 32.0,
                beta_slow: 1.0,
            },
        );
        assert_eq!(yarn[0], plain[0]);
        let last = plain.len() - 1;
        assert!((yarn[last] - plain[last] / 16.0).abs() <= plain[last] * 1e-6);
        let ratio: Vec<f32> = yarn.iter().zip(&plain).map(|(y, p)| y / p).collect();
        assert!(ratio.windows(2).all(|w| w[1] <= w[0] + 1e-6), "{ratio:?}");
        assert!(ratio.iter().any(|&r| r < 0.99 && r > 1.0 / 16.0 + 1e-3));
    }

    #[test]
    fn llama3_keeps_short_divides_long_and_blends_between() {
        // theta 10000, head_dim 8: wavelengths 6.3, 63, 628, 6283 against
        // bounds 16 (high) and 64 (low).
        let plain = inv_freq(10_000.0, 8, &RopeScaling::None);
        let scaled = inv_freq(
            10_000.0,
            8,
            &RopeScaling::Llama3 {
                factor: 8.0,
                low_freq_factor: 1.0,
                high_freq_factor: 4.0,
                original_max_position_embeddings: 64,
            },
        );
        assert_eq!(scaled[0], plain[0]);
        assert!(scaled[1] < plain[1] && scaled[1] > plain[1] / 8.0);
        assert!((scaled[2] - plain[2] / 8.0).abs() < 1e-9);
        assert!((scaled[3] - plain[3] / 8.0).abs() < 1e-9);
    }

    #[test]
    fn linear_divides_every_frequency() {
        let plain = inv_freq(500.0, 16, &RopeScaling::None);
        let scaled = inv_freq(500.0, 16, &RopeScaling::Linear { factor: 4.0 });
        for (p, s) in plain.iter().zip(&scaled) {
            assert!((p / 4.0 - s).abs() <= f32::EPSILON * p);
        }
    }
}
