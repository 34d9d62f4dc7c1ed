//! ggml's scalar conversions as its reference C computes them on x86-64
//! (SSE floats, no FMA), so the searches built on them pick the same
//! integers: `nearest_int`'s magic-number rounding, `GGML_FP32_TO_FP16`,
//! and C's float-to-integer casts.

use half::f16;

/// ggml's `nearest_int`: adding 1.5·2²³ pushes the fraction out of the
/// mantissa, so the FPU's round-to-nearest-even does the rounding (ties go
/// to even, unlike `roundf`), and the low 22 mantissa bits hold the result
/// offset by 2²². Bit for bit the C, also outside the ±2²² range its assert
/// guards (release builds compile the assert out).
#[inline]
pub(super) fn nearest_int(v: f32) -> i32 {
    let val = v + 12_582_912.0;
    (val.to_bits() as i32 & 0x007f_ffff) - 0x0040_0000
}

/// `GGML_FP32_TO_FP16` (`ggml_compute_fp32_to_fp16`, the portable branch a
/// build without F16C uses): round to nearest even, overflow to ±inf, NaN to
/// a quiet NaN with the sign kept. Ported line by line rather than taken
/// from `half`, so the NaN encoding is ggml's too.
pub(super) fn fp16_bits(f: f32) -> u16 {
    let scale_to_inf = f32::from_bits(0x7780_0000); // 2^112
    let scale_to_zero = f32::from_bits(0x0880_0000); // 2^-110
    let mut base = (f.abs() * scale_to_inf) * scale_to_zero;
    let w = f.to_bits();
    let shl1_w = w.wrapping_add(w);
    let sign = w & 0x8000_0000;
    let bias = (shl1_w & 0xFF00_0000).max(0x7100_0000);
    base += f32::from_bits((bias >> 1) + 0x0780_0000);
    let bits = base.to_bits();
    let exp_bits = (bits >> 13) & 0x0000_7C00;
    let mantissa_bits = bits & 0x0000_0FFF;
    let nonsign = exp_bits + mantissa_bits;
    ((sign >> 16)
        | if shl1_w > 0xFF00_0000 {
            0x7E00
        } else {
            nonsign
        }) as u16
}

/// `GGML_FP16_TO_FP32`: a stored scale as the dequantizer reads it back,
/// which the K-quants requantize against (exact).
pub(super) fn fp16_value(h: u16) -> f32 {
    f16::from_bits(h).to_f32()
}

/// C's `(int)f` as x86-64 compiles it (`cvttss2si`): truncation toward
/// zero, and the "integer indefinite" `INT_MIN` for NaN and out-of-range
/// values (Rust's `as` saturates instead). Casts to `int8_t`/`uint8_t` go
/// through this and keep the low byte, as gcc emits them.
#[inline]
pub(super) fn cvtt(f: f32) -> i32 {
    if (-2_147_483_648.0..2_147_483_648.0).contains(&f) {
        f as i32
    } else {
        i32::MIN
    }
}

/// ggml's `MAX(a, b)` macro on floats: `a > b ? a : b` (with a NaN the
/// second operand wins, not what `f32::max` does).
#[inline]
pub(super) fn c_max(a: f32, b: f32) -> f32 {
    if a > b { a } else { b }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_int_ties_to_even() {
        assert_eq!(nearest_int(0.5), 0);
        assert_eq!(nearest_int(1.5), 2);
        assert_eq!(nearest_int(-0.5), 0);
        assert_eq!(nearest_int(-2.5), -2);
        assert_eq!(nearest_int(-3.7), -4);
        assert_eq!(nearest_int(63.49), 63);
    }

    #[test]
    fn fp16_matches_half_on_finite_values() {
        for bits in (0..=u32::MAX).step_by(65_537) {
            let f = f32::from_bits(bits);
            if f.is_finite() {
                assert_eq!(fp16_bits(f), f16::from_f32(f).to_bits(), "{f:e}");
            }
        }
        assert_eq!(fp16_bits(f32::NAN), 0x7E00);
        assert_eq!(fp16_bits(65520.0), 0x7C00);
    }

    #[test]
    fn cvtt_is_x86_truncation() {
        assert_eq!(cvtt(-0.9), 0);
        assert_eq!(cvtt(16.99), 16);
        assert_eq!(cvtt(f32::INFINITY), i32::MIN);
        assert_eq!(cvtt(f32::NAN), i32::MIN);
        assert_eq!(cvtt(3e9), i32::MIN);
    }
}
