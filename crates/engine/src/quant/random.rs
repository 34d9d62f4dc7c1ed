//! Random but valid stored tensors for tests and benches: every block's
//! scale fields finite (f16 scales mostly ±[0.002, 0.05], now and then a
//! subnormal; E8M0 exponents around 2^-4), no NaN codes, scale grids of
//! positive f32 with arbitrary mantissas, so products round and stay
//! finite. Deterministic per seed (a xorshift stream).

use super::{QuantTensor, ScaleGrid, WeightBytes, WeightType};

/// Every stored type that runs the reference product over dequantized
/// rows (all but Q4_1 / Q8_0, which have block kernels of their own).
pub const STORED_TYPES: [WeightType; 15] = [
    WeightType::F16,
    WeightType::BF16,
    WeightType::Q4_0,
    WeightType::Q5_0,
    WeightType::Q5_1,
    WeightType::Q2_K,
    WeightType::Q3_K,
    WeightType::Q4_K,
    WeightType::Q5_K,
    WeightType::Q6_K,
    WeightType::Q8_K,
    WeightType::IQ2_XXS,
    WeightType::MXFP4,
    WeightType::FP8_E4M3,
    WeightType::FP4_E2M1,
];

/// Scale-grid blocks (rows, columns) of the scaled types: DeepSeek's FP8
/// 128×128 and its FP4 experts' 1×32.
pub fn grid_blocks(ty: WeightType) -> (usize, usize) {
    match ty {
        WeightType::FP4_E2M1 => (1, 32),
        _ => (128, 128),
    }
}

/// `len` activations in [-3, 1) with every 97th (from the 6th) 40×
/// larger: the few huge channels real hidden states have, which make some
/// activation blocks coarse when rounded to int8 (the fast kernel sets'
/// tests and benches).
pub fn activations_with_outliers(len: usize, seed: u64) -> Vec<f32> {
    let mut r = Rng::new(seed);
    (0..len)
        .map(|i| {
            let v = r.unit() * 2.0 - 1.0;
            if i % 97 == 5 { v * 40.0 } else { v }
        })
        .collect()
}

/// A xorshift stream of bytes and small floats.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// Uniform in [-1, 1).
    pub fn unit(&mut self) -> f32 {
        ((self.next_u64() >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }

    pub fn bytes(&mut self, out: &mut Vec<u8>, n: usize) {
        out.extend((0..n).map(|_| (self.next_u64() >> 24) as u8));
    }

    /// An f16 block scale: mostly ±[0.002, 0.05], sometimes an f16
    /// subnormal (its exact widening on the device is part of the test).
    pub fn scale(&mut self, out: &mut Vec<u8>) {
        let v = if self.next_u64().is_multiple_of(16) {
            half::f16::from_bits((self.next_u64() % 1023 + 1) as u16).to_f32()
        } else {
            let m = 0.002 + 0.048 * (self.unit() * 0.5 + 0.5);
            if self.next_u64().is_multiple_of(4) {
                -m
            } else {
                m
            }
        };
        out.extend_from_slice(&half::f16::from_f32(v).to_le_bytes());
    }
}

/// `rows` rows of `cols` values of `ty` as random valid blocks (finite f16
/// scales, no NaN codes).
pub fn random_bytes(ty: WeightType, rows: usize, cols: usize, r: &mut Rng) -> Vec<u8> {
    let units = rows * cols / ty.block_len();
    let mut b = Vec::with_capacity(units * ty.block_bytes());
    for _ in 0..units {
        match ty {
            WeightType::F16 => b.extend_from_slice(&half::f16::from_f32(r.unit()).to_le_bytes()),
            WeightType::BF16 => {
                b.extend_from_slice(&((r.unit().to_bits() >> 16) as u16).to_le_bytes())
            }
            WeightType::Q4_0 | WeightType::IQ4_NL => {
                r.scale(&mut b);
                r.bytes(&mut b, 16);
            }
            WeightType::Q5_0 => {
                r.scale(&mut b);
                r.bytes(&mut b, 20);
            }
            WeightType::Q5_1 => {
                r.scale(&mut b);
                r.scale(&mut b);
                r.bytes(&mut b, 20);
            }
            WeightType::Q4_1 => {
                r.scale(&mut b);
                r.scale(&mut b);
                r.bytes(&mut b, 16);
            }
            WeightType::Q8_0 => {
                r.scale(&mut b);
                r.bytes(&mut b, 32);
            }
            WeightType::Q2_K => {
                r.bytes(&mut b, 80);
                r.scale(&mut b);
                r.scale(&mut b);
            }
            WeightType::Q3_K => {
                r.bytes(&mut b, 108);
                r.scale(&mut b);
            }
            WeightType::Q4_K => {
                r.scale(&mut b);
                r.scale(&mut b);
                r.bytes(&mut b, 140);
            }
            WeightType::Q5_K => {
                r.scale(&mut b);
                r.scale(&mut b);
                r.bytes(&mut b, 172);
            }
            WeightType::Q6_K => {
                r.bytes(&mut b, 208);
                r.scale(&mut b);
            }
            WeightType::Q8_K => {
                let d = 0.001 + 0.01 * (r.unit() * 0.5 + 0.5);
                b.extend_from_slice(&d.to_le_bytes());
                r.bytes(&mut b, 288);
            }
            WeightType::IQ2_XXS => {
                r.scale(&mut b);
                r.bytes(&mut b, 64);
            }
            WeightType::MXFP4 => {
                // E8M0 exponents around 2^-4, now and then the subnormal
                // halves of codes 0 and 1.
                let e = match r.next_u64() % 32 {
                    0 => (r.next_u64() % 2) as u8,
                    _ => 118 + (r.next_u64() % 12) as u8,
                };
                b.push(e);
                r.bytes(&mut b, 16);
            }
            WeightType::FP8_E4M3 => {
                let mut v = (r.next_u64() >> 24) as u8;
                if v & 0x7f == 0x7f {
                    v -= 1; // S.1111.111 is NaN
                }
                b.push(v);
            }
            WeightType::FP4_E2M1 => r.bytes(&mut b, 1),
            other => panic!("no random blocks for {other}"),
        }
    }
    b
}

/// A grid of positive f32 scales with arbitrary mantissas (so the products
/// round), for `rows × cols` values in blocks of `blocks`.
pub fn random_grid(rows: usize, cols: usize, blocks: (usize, usize), r: &mut Rng) -> ScaleGrid {
    let n = rows.div_ceil(blocks.0) * cols.div_ceil(blocks.1);
    let values: Vec<f32> = (0..n)
        .map(|_| (1.0 + 0.999 * (r.unit() * 0.5 + 0.5)) * 2f32.powi((r.next_u64() % 7) as i32 - 6))
        .collect();
    ScaleGrid {
        values: values.into(),
        block_rows: blocks.0,
        block_cols: blocks.1,
    }
}

/// A stored tensor of `dims` whose rows are `parts` (row counts) joined,
/// each part with its own scale grid for the scaled types.
pub fn random_stored(ty: WeightType, dims: &[usize], parts: &[usize], seed: u64) -> QuantTensor {
    let cols = *dims.last().unwrap();
    let mut r = Rng::new(seed);
    let tensors: Vec<QuantTensor> = parts
        .iter()
        .map(|&rows| {
            let scales = ty
                .needs_scales()
                .then(|| random_grid(rows, cols, grid_blocks(ty), &mut r));
            QuantTensor::new(
                ty,
                vec![rows, cols],
                WeightBytes::owned(random_bytes(ty, rows, cols, &mut r)),
                scales,
            )
            .unwrap()
        })
        .collect();
    let refs: Vec<&QuantTensor> = tensors.iter().collect();
    QuantTensor::join(dims.to_vec(), &refs).unwrap()
}
