//! Bicubic resampling of 8-bit RGB exactly as Pillow does it
//! (`libImaging/Resample.c`, the `*_8bpc` path), because the reference image
//! processor (transformers' PIL backend of `Qwen2VLImageProcessor`) resizes
//! with `PIL.Image.resize(size, BICUBIC)` on the uint8 image before it
//! rescales. Pillow's result is defined by its integer arithmetic: weights
//! computed in f64 per output pixel (a Keys cubic, a = −0.5, its support
//! widened by the scale when shrinking, i.e. antialiased), normalised to sum
//! 1, rounded to fixed point with 22 fractional bits; a horizontal pass to
//! u8 (clipped), then a vertical pass to u8. Reproducing those steps gives
//! the same bytes, not merely close ones.

/// Fractional bits of Pillow's fixed-point weights (`32 − 8 − 2`).
const PRECISION_BITS: u32 = 22;

/// Pillow's bicubic kernel (`bicubic_filter`, a = −0.5), support 2.
fn bicubic(x: f64) -> f64 {
    const A: f64 = -0.5;
    let x = x.abs();
    if x < 1.0 {
        ((A + 2.0) * x - (A + 3.0)) * x * x + 1.0
    } else if x < 2.0 {
        (((x - 5.0) * x + 8.0) * x - 4.0) * A
    } else {
        0.0
    }
}

/// Per output pixel: the first input index, the tap count and the taps.
struct Coeffs {
    ksize: usize,
    bounds: Vec<(usize, usize)>,
    weights: Vec<i32>,
}

/// `precompute_coeffs` + `normalize_coeffs_8bpc` for a box `[0, in_size)`.
fn coeffs(in_size: usize, out_size: usize) -> Coeffs {
    let scale = in_size as f64 / out_size as f64;
    let filterscale = scale.max(1.0);
    let support = 2.0 * filterscale;
    let ksize = support.ceil() as usize * 2 + 1;
    let mut bounds = Vec::with_capacity(out_size);
    let mut weights = vec![0i32; out_size * ksize];
    let mut k = vec![0f64; ksize];
    for xx in 0..out_size {
        let center = (xx as f64 + 0.5) * scale;
        let ss = 1.0 / filterscale;
        // C's `(int)` truncates toward zero, then the bound is clamped.
        let xmin = ((center - support + 0.5) as i64).max(0) as usize;
        let xmax = ((center + support + 0.5) as i64).min(in_size as i64) as usize - xmin;
        let mut ww = 0.0;
        for (x, kx) in k.iter_mut().enumerate().take(xmax) {
            let w = bicubic((x as f64 + xmin as f64 - center + 0.5) * ss);
            *kx = w;
            ww += w;
        }
        for (x, kx) in k.iter().enumerate().take(xmax) {
            let v = if ww != 0.0 { kx / ww } else { *kx };
            let f = v * f64::from(1u32 << PRECISION_BITS);
            weights[xx * ksize + x] = if v < 0.0 {
                (-0.5 + f) as i32
            } else {
                (0.5 + f) as i32
            };
        }
        bounds.push((xmin, xmax));
    }
    Coeffs {
        ksize,
        bounds,
        weights,
    }
}

/// Pillow's `clip8`: the rounded fixed-point sum back to a byte.
fn clip8(v: i32) -> u8 {
    if v >= (1 << PRECISION_BITS << 8) {
        255
    } else if v <= 0 {
        0
    } else {
        (v >> PRECISION_BITS) as u8
    }
}

/// An interleaved RGB image, 8 bits per channel.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rgb8 {
    pub width: usize,
    pub height: usize,
    /// `height · width · 3` bytes, row-major.
    pub data: Vec<u8>,
}

/// `Image.resize((width, height), BICUBIC)` of an RGB image.
pub fn resize_bicubic(img: &Rgb8, width: usize, height: usize) -> Rgb8 {
    let mut cur = img.clone();
    // Pillow runs the horizontal pass first, and skips a pass whose size
    // does not change.
    if width != cur.width {
        cur = horizontal(&cur, width);
    }
    if height != cur.height {
        cur = vertical(&cur, height);
    }
    cur
}

fn horizontal(img: &Rgb8, out_w: usize) -> Rgb8 {
    let c = coeffs(img.width, out_w);
    let mut data = vec![0u8; img.height * out_w * 3];
    for y in 0..img.height {
        let row = &img.data[y * img.width * 3..(y + 1) * img.width * 3];
        for (xx, &(xmin, xmax)) in c.bounds.iter().enumerate() {
            let k = &c.weights[xx * c.ksize..xx * c.ksize + xmax];
            for ch in 0..3 {
                let mut ss = 1i32 << (PRECISION_BITS - 1);
                for (x, &w) in k.iter().enumerate() {
                    ss += i32::from(row[(x + xmin) * 3 + ch]) * w;
                }
                data[(y * out_w + xx) * 3 + ch] = clip8(ss);
            }
        }
    }
    Rgb8 {
        width: out_w,
        height: img.height,
        data,
    }
}

fn vertical(img: &Rgb8, out_h: usize) -> Rgb8 {
    let c = coeffs(img.height, out_h);
    let w3 = img.width * 3;
    let mut data = vec![0u8; out_h * w3];
    for (yy, &(ymin, ymax)) in c.bounds.iter().enumerate() {
        let k = &c.weights[yy * c.ksize..yy * c.ksize + ymax];
        for i in 0..w3 {
            let mut ss = 1i32 << (PRECISION_BITS - 1);
            for (y, &w) in k.iter().enumerate() {
                ss += i32::from(img.data[(y + ymin) * w3 + i]) * w;
            }
            data[yy * w3 + i] = clip8(ss);
        }
    }
    Rgb8 {
        width: img.width,
        height: out_h,
        data,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn weights_sum_to_one_in_fixed_point_and_identity_copies() {
        for (i, o) in [(20, 64), (300, 256), (7, 7), (170, 160), (1, 5)] {
            let c = coeffs(i, o);
            for xx in 0..o {
                let (_, n) = c.bounds[xx];
                let s: i64 = c.weights[xx * c.ksize..xx * c.ksize + n]
                    .iter()
                    .map(|&w| i64::from(w))
                    .sum();
                assert!(
                    (s - (1 << PRECISION_BITS)).abs() <= n as i64,
                    "{i}->{o} row {xx}: {s}"
                );
            }
        }
        let img = Rgb8 {
            width: 3,
            height: 2,
            data: (0..18).map(|v| v * 13).collect(),
        };
        assert_eq!(resize_bicubic(&img, 3, 2), img);
    }

    #[test]
    fn a_flat_image_stays_flat_through_both_passes() {
        let img = Rgb8 {
            width: 37,
            height: 23,
            data: [10u8, 200, 77].repeat(37 * 23),
        };
        let out = resize_bicubic(&img, 64, 96);
        assert!(out.data.chunks(3).all(|p| p == [10, 200, 77]));
        let out = resize_bicubic(&img, 5, 4);
        assert!(out.data.chunks(3).all(|p| p == [10, 200, 77]));
    }
}
