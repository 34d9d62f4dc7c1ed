//! The nucleus law's weights `exp(l/T - m)` over many f64 lanes at a time,
//! bit-identical to the scalar `f64::exp` the law is defined with.
//!
//! `f64::exp` is the C library's `exp`, and the law's oracle calls the same
//! function (`math.exp`). On glibc (2.28 and later; x86_64 selects the
//! build compiled with FMA on any CPU with AVX2 and FMA, which the
//! x86-64-v3 baseline of this build requires) that is Szabolcs Nagy's
//! table method (ARM optimized-routines, `__exp_data`, N = 128, a
//! degree-5 polynomial). Read off this machine's glibc 2.36 `__exp_fma`:
//!
//! ```text
//! kd   = fma(x, N/ln2, 0x1.8p52)         // round x·N/ln2 to an integer k
//! ki   = asuint64(kd); kd -= 0x1.8p52
//! r    = fma(kd, -ln2lo/N, fma(kd, -ln2hi/N, x))
//! tail = asdouble(T[2(k % N)]); sbits = T[2(k % N) + 1] + (k << 45)
//! r2   = r·r
//! tmp  = fma(r2·r2, fma(r, C5, C4), fma(fma(r, C3, C2), r2, tail + r))
//! exp(x) = fma(scale, tmp, scale), scale = asdouble(sbits)
//! ```
//!
//! for every `x` with `2^-54 <= |x| < 512` (the top 12 bits of `|x|` in
//! `0x3c9..=0x407`). Every other lane (0, tiny, large, inf, NaN) is patched
//! with the scalar call itself, so the lanes need not reproduce glibc's
//! special cases. The tests compare against `f64::exp` on millions of
//! arguments over the whole range on every run (an `#[ignore]`d test
//! covers 2^32 more), and the law's oracle tests run through this path.
//!
//! Why: one full-vocabulary row of the law spends two thirds of its time
//! in `exp`, and a speculative cycle reads three such rows.

#[cfg(all(
    target_arch = "x86_64",
    target_env = "gnu",
    target_feature = "avx2",
    target_feature = "fma"
))]
use std::arch::x86_64::*;

/// `N / ln 2`, `N = 128` (`__exp_data.invln2N`).
const INV_LN2_N: f64 = f64::from_bits(0x4067_1547_652b_82fe);
/// `-ln 2 / N` split in a high part (exact products) and a low part.
const NEG_LN2_HI_N: f64 = f64::from_bits(0xbf76_2e42_fefa_0000);
const NEG_LN2_LO_N: f64 = f64::from_bits(0xbd0c_f79a_bc9e_3b3a);
/// `__exp_data.poly`: the coefficients of `r^2 .. r^5`.
const C2: f64 = f64::from_bits(0x3fdf_ffff_ffff_fdbd);
const C3: f64 = f64::from_bits(0x3fc5_5555_5555_543c);
const C4: f64 = f64::from_bits(0x3fa5_5555_cf17_2b91);
const C5: f64 = f64::from_bits(0x3f81_1111_67a4_d017);
/// `0x1.8p52`: adding it rounds to an integer held in the low bits.
const SHIFT: f64 = f64::from_bits(0x4338_0000_0000_0000);
/// The top 12 bits of `|x|` the table path covers: `2^-54 <= |x| < 512`.
const ABSTOP_LO: u64 = 0x3c9;
const ABSTOP_SPAN: u64 = 0x3e;

/// `__exp_data.tab`: for each `i < 128`, the tail `2^(i/N) - scale_i`
/// and `asuint64(scale_i) - (i << 45)`, interleaved.
#[rustfmt::skip]
static TABLE: [u64; 256] = [
    0x0000000000000000, 0x3ff0000000000000,
    0x3c9b3b4f1a88bf6e, 0x3feff63da9fb3335,
    0xbc7160139cd8dc5d, 0x3fefec9a3e778061,
    0xbc905e7a108766d1, 0x3fefe315e86e7f85,
    0x3c8cd2523567f613, 0x3fefd9b0d3158574,
    0xbc8bce8023f98efa, 0x3fefd06b29ddf6de,
    0x3c60f74e61e6c861, 0x3fefc74518759bc8,
    0x3c90a3e45b33d399, 0x3fefbe3ecac6f383,
    0x3c979aa65d837b6d, 0x3fefb5586cf9890f,
    0x3c8eb51a92fdeffc, 0x3fefac922b7247f7,
    0x3c3ebe3d702f9cd1, 0x3fefa3ec32d3d1a2,
    0xbc6a033489906e0b, 0x3fef9b66affed31b,
    0xbc9556522a2fbd0e, 0x3fef9301d0125b51,
    0xbc5080ef8c4eea55, 0x3fef8abdc06c31cc,
    0xbc91c923b9d5f416, 0x3fef829aaea92de0,
    0x3c80d3e3e95c55af, 0x3fef7a98c8a58e51,
    0xbc801b15eaa59348, 0x3fef72b83c7d517b,
    0xbc8f1ff055de323d, 0x3fef6af9388c8dea,
    0x3c8b898c3f1353bf, 0x3fef635beb6fcb75,
    0xbc96d99c7611eb26, 0x3fef5be084045cd4,
    0x3c9aecf73e3a2f60, 0x3fef54873168b9aa,
    0xbc8fe782cb86389d, 0x3fef4d5022fcd91d,
    0x3c8a6f4144a6c38d, 0x3fef463b88628cd6,
    0x3c807a05b0e4047d, 0x3fef3f49917ddc96,
    0x3c968efde3a8a894, 0x3fef387a6e756238,
    0x3c875e18f274487d, 0x3fef31ce4fb2a63f,
    0x3c80472b981fe7f2, 0x3fef2b4565e27cdd,
    0xbc96b87b3f71085e, 0x3fef24dfe1f56381,
    0x3c82f7e16d09ab31, 0x3fef1e9df51fdee1,
    0xbc3d219b1a6fbffa, 0x3fef187fd0dad990,
    0x3c8b3782720c0ab4, 0x3fef1285a6e4030b,
    0x3c6e149289cecb8f, 0x3fef0cafa93e2f56,
    0x3c834d754db0abb6, 0x3fef06fe0a31b715,
    0x3c864201e2ac744c, 0x3fef0170fc4cd831,
    0x3c8fdd395dd3f84a, 0x3feefc08b26416ff,
    0xbc86a3803b8e5b04, 0x3feef6c55f929ff1,
    0xbc924aedcc4b5068, 0x3feef1a7373aa9cb,
    0xbc9907f81b512d8e, 0x3feeecae6d05d866,
    0xbc71d1e83e9436d2, 0x3feee7db34e59ff7,
    0xbc991919b3ce1b15, 0x3feee32dc313a8e5,
    0x3c859f48a72a4c6d, 0x3feedea64c123422,
    0xbc9312607a28698a, 0x3feeda4504ac801c,
    0xbc58a78f4817895b, 0x3feed60a21f72e2a,
    0xbc7c2c9b67499a1b, 0x3feed1f5d950a897,
    0x3c4363ed60c2ac11, 0x3feece086061892d,
    0x3c9666093b0664ef, 0x3feeca41ed1d0057,
    0x3c6ecce1daa10379, 0x3feec6a2b5c13cd0,
    0x3c93ff8e3f0f1230, 0x3feec32af0d7d3de,
    0x3c7690cebb7aafb0, 0x3feebfdad5362a27,
    0x3c931dbdeb54e077, 0x3feebcb299fddd0d,
    0xbc8f94340071a38e, 0x3feeb9b2769d2ca7,
    0xbc87deccdc93a349, 0x3feeb6daa2cf6642,
    0xbc78dec6bd0f385f, 0x3feeb42b569d4f82,
    0xbc861246ec7b5cf6, 0x3feeb1a4ca5d920f,
    0x3c93350518fdd78e, 0x3feeaf4736b527da,
    0x3c7b98b72f8a9b05, 0x3feead12d497c7fd,
    0x3c9063e1e21c5409, 0x3feeab07dd485429,
    0x3c34c7855019c6ea, 0x3feea9268a5946b7,
    0x3c9432e62b64c035, 0x3feea76f15ad2148,
    0xbc8ce44a6199769f, 0x3feea5e1b976dc09,
    0xbc8c33c53bef4da8, 0x3feea47eb03a5585,
    0xbc845378892be9ae, 0x3feea34634ccc320,
    0xbc93cedd78565858, 0x3feea23882552225,
    0x3c5710aa807e1964, 0x3feea155d44ca973,
    0xbc93b3efbf5e2228, 0x3feea09e667f3bcd,
    0xbc6a12ad8734b982, 0x3feea012750bdabf,
    0xbc6367efb86da9ee, 0x3fee9fb23c651a2f,
    0xbc80dc3d54e08851, 0x3fee9f7df9519484,
    0xbc781f647e5a3ecf, 0x3fee9f75e8ec5f74,
    0xbc86ee4ac08b7db0, 0x3fee9f9a48a58174,
    0xbc8619321e55e68a, 0x3fee9feb564267c9,
    0x3c909ccb5e09d4d3, 0x3feea0694fde5d3f,
    0xbc7b32dcb94da51d, 0x3feea11473eb0187,
    0x3c94ecfd5467c06b, 0x3feea1ed0130c132,
    0x3c65ebe1abd66c55, 0x3feea2f336cf4e62,
    0xbc88a1c52fb3cf42, 0x3feea427543e1a12,
    0xbc9369b6f13b3734, 0x3feea589994cce13,
    0xbc805e843a19ff1e, 0x3feea71a4623c7ad,
    0xbc94d450d872576e, 0x3feea8d99b4492ed,
    0x3c90ad675b0e8a00, 0x3feeaac7d98a6699,
    0x3c8db72fc1f0eab4, 0x3feeace5422aa0db,
    0xbc65b6609cc5e7ff, 0x3feeaf3216b5448c,
    0x3c7bf68359f35f44, 0x3feeb1ae99157736,
    0xbc93091fa71e3d83, 0x3feeb45b0b91ffc6,
    0xbc5da9b88b6c1e29, 0x3feeb737b0cdc5e5,
    0xbc6c23f97c90b959, 0x3feeba44cbc8520f,
    0xbc92434322f4f9aa, 0x3feebd829fde4e50,
    0xbc85ca6cd7668e4b, 0x3feec0f170ca07ba,
    0x3c71affc2b91ce27, 0x3feec49182a3f090,
    0x3c6dd235e10a73bb, 0x3feec86319e32323,
    0xbc87c50422622263, 0x3feecc667b5de565,
    0x3c8b1c86e3e231d5, 0x3feed09bec4a2d33,
    0xbc91bbd1d3bcbb15, 0x3feed503b23e255d,
    0x3c90cc319cee31d2, 0x3feed99e1330b358,
    0x3c8469846e735ab3, 0x3feede6b5579fdbf,
    0xbc82dfcd978e9db4, 0x3feee36bbfd3f37a,
    0x3c8c1a7792cb3387, 0x3feee89f995ad3ad,
    0xbc907b8f4ad1d9fa, 0x3feeee07298db666,
    0xbc55c3d956dcaeba, 0x3feef3a2b84f15fb,
    0xbc90a40e3da6f640, 0x3feef9728de5593a,
    0xbc68d6f438ad9334, 0x3feeff76f2fb5e47,
    0xbc91eee26b588a35, 0x3fef05b030a1064a,
    0x3c74ffd70a5fddcd, 0x3fef0c1e904bc1d2,
    0xbc91bdfbfa9298ac, 0x3fef12c25bd71e09,
    0x3c736eae30af0cb3, 0x3fef199bdd85529c,
    0x3c8ee3325c9ffd94, 0x3fef20ab5fffd07a,
    0x3c84e08fd10959ac, 0x3fef27f12e57d14b,
    0x3c63cdaf384e1a67, 0x3fef2f6d9406e7b5,
    0x3c676b2c6c921968, 0x3fef3720dcef9069,
    0xbc808a1883ccb5d2, 0x3fef3f0b555dc3fa,
    0xbc8fad5d3ffffa6f, 0x3fef472d4a07897c,
    0xbc900dae3875a949, 0x3fef4f87080d89f2,
    0x3c74a385a63d07a7, 0x3fef5818dcfba487,
    0xbc82919e2040220f, 0x3fef60e316c98398,
    0x3c8e5a50d5c192ac, 0x3fef69e603db3285,
    0x3c843a59ac016b4b, 0x3fef7321f301b460,
    0xbc82d52107b43e1f, 0x3fef7c97337b9b5f,
    0xbc892ab93b470dc9, 0x3fef864614f5a129,
    0x3c74b604603a88d3, 0x3fef902ee78b3ff6,
    0x3c83c5ec519d7271, 0x3fef9a51fbc74c83,
    0xbc8ff7128fd391f0, 0x3fefa4afa2a490da,
    0xbc8dae98e223747d, 0x3fefaf482d8e67f1,
    0x3c8ec3bc41aa2008, 0x3fefba1bee615a27,
    0x3c842b94c3a9eb32, 0x3fefc52b376bba97,
    0x3c8a64a931d185ee, 0x3fefd0765b6e4540,
    0xbc8e37bae43be3ed, 0x3fefdbfdad9cbe14,
    0x3c77893b4d91cd9d, 0x3fefe7c1819e90d8,
    0x3c5305c14160cc89, 0x3feff3c22b8f71f1,
];

/// Rows with fewer finite entries than this fraction of their length
/// (an MTP head's subset row: 1/6) are compacted before the lanes run,
/// so the lanes never spend work on -inf entries.
const SPARSE_BELOW: f64 = 0.5;

/// Reusable buffers for a sparse row's compaction.
#[derive(Debug, Default, Clone)]
pub(crate) struct Sparse {
    ids: Vec<u32>,
    values: Vec<f64>,
    weights: Vec<f64>,
}

/// `out[i] = 0` where `l[i]` is -inf, else `exp(l[i] / t - m)`, each
/// exactly as the scalar expression computes it (`out` is overwritten);
/// returns `Z`, the sum of `out` added one entry after another in index
/// order.
///
/// `Z` is accumulated as the weights are made, so the chain of dependent
/// additions (three cycles each, 49k of them for a trunk row) overlaps
/// the lanes' work instead of following it. Zero weights are not added:
/// `z + 0 = z` exactly for the `z >= +0` this sum holds.
pub(crate) fn scaled_exp<L: Copy + Into<f64>>(
    l: &[L],
    t: f64,
    m: f64,
    out: &mut Vec<f64>,
    sparse: &mut Sparse,
) -> f64 {
    out.clear();
    out.resize(l.len(), 0.0);
    let finite = l.iter().filter(|&&x| x.into() != f64::NEG_INFINITY).count();
    if (finite as f64) >= SPARSE_BELOW * l.len() as f64 {
        return dense(l, t, m, out);
    }
    // Compact the finite entries (skipping all-(-inf) chunks whole), run
    // the lanes over them, and scatter: `out` already holds the zeros.
    sparse.ids.resize(finite, 0);
    sparse.values.resize(finite, 0.0);
    let mut n = 0;
    for (c, chunk) in l.chunks(8).enumerate() {
        let mut lanes = 0u32;
        for (j, &x) in chunk.iter().enumerate() {
            lanes |= u32::from(x.into() != f64::NEG_INFINITY) << j;
        }
        while lanes != 0 {
            let j = lanes.trailing_zeros() as usize;
            sparse.ids[n] = (c * 8 + j) as u32;
            sparse.values[n] = chunk[j].into();
            n += 1;
            lanes &= lanes - 1;
        }
    }
    sparse.weights.clear();
    sparse.weights.resize(sparse.values.len(), 0.0);
    // The compacted entries are in index order, so this is Z's order.
    let z = dense(&sparse.values, t, m, &mut sparse.weights);
    for (&i, &w) in sparse.ids.iter().zip(&sparse.weights) {
        out[i as usize] = w;
    }
    z
}

/// [`scaled_exp`] over every entry of `l` in place of `out`.
fn dense<L: Copy + Into<f64>>(l: &[L], t: f64, m: f64, out: &mut [f64]) -> f64 {
    #[cfg(all(
        target_arch = "x86_64",
        target_env = "gnu",
        target_feature = "avx2",
        target_feature = "fma"
    ))]
    {
        if std::arch::is_x86_feature_detected!("avx512f") {
            // SAFETY: AVX-512F was just detected.
            unsafe { lanes_avx512(l, t, m, out) }
        } else {
            // SAFETY: the cfg guarantees AVX2 and FMA at compile time.
            unsafe { lanes_avx2(l, t, m, out) }
        }
    }
    #[cfg(not(all(
        target_arch = "x86_64",
        target_env = "gnu",
        target_feature = "avx2",
        target_feature = "fma"
    )))]
    scalar(l, t, m, out, 0.0)
}

/// The scalar definition, for the ends of a row and other targets; `z`
/// continues the running sum.
fn scalar<L: Copy + Into<f64>>(l: &[L], t: f64, m: f64, out: &mut [f64], mut z: f64) -> f64 {
    for (o, &x) in out.iter_mut().zip(l) {
        *o = weight(x.into(), t, m);
        z += *o;
    }
    z
}

#[inline(always)]
fn weight(x: f64, t: f64, m: f64) -> f64 {
    if x == f64::NEG_INFINITY {
        0.0
    } else {
        (x / t - m).exp()
    }
}

/// Widens one chunk of the row to f64 (f32 -> f64 is exact).
#[inline(always)]
fn widen<L: Copy + Into<f64>, const W: usize>(c: &[L]) -> [f64; W] {
    let mut a = [0.0f64; W];
    for (a, &x) in a.iter_mut().zip(c) {
        *a = x.into();
    }
    a
}

#[cfg(all(
    target_arch = "x86_64",
    target_env = "gnu",
    target_feature = "avx2",
    target_feature = "fma"
))]
#[target_feature(enable = "avx512f")]
fn lanes_avx512<L: Copy + Into<f64>>(l: &[L], t: f64, m: f64, out: &mut [f64]) -> f64 {
    let mut z = 0.0f64;
    let mut chunks = l.chunks_exact(8);
    let mut outs = out.chunks_exact_mut(8);
    let (tv, mv) = (_mm512_set1_pd(t), _mm512_set1_pd(m));
    let neg_inf = _mm512_set1_pd(f64::NEG_INFINITY);
    for (c, o) in (&mut chunks).zip(&mut outs) {
        let a = widen::<L, 8>(c);
        // SAFETY: `a` and `o` hold 8 f64; TABLE indices are < 256.
        unsafe {
            let raw = _mm512_loadu_pd(a.as_ptr());
            let masked = _mm512_cmp_pd_mask::<_CMP_EQ_OQ>(raw, neg_inf);
            if masked == 0xff {
                // A head's draft row is -inf outside its subset.
                _mm512_storeu_pd(o.as_mut_ptr(), _mm512_setzero_pd());
                continue;
            }
            let x = _mm512_sub_pd(_mm512_div_pd(raw, tv), mv);
            let bits = _mm512_castpd_si512(x);
            let abstop = _mm512_and_si512(_mm512_srli_epi64::<52>(bits), _mm512_set1_epi64(0x7ff));
            let off = _mm512_sub_epi64(abstop, _mm512_set1_epi64(ABSTOP_LO as i64));
            let special = _mm512_cmpgt_epu64_mask(off, _mm512_set1_epi64(ABSTOP_SPAN as i64));
            let kd = _mm512_fmadd_pd(x, _mm512_set1_pd(INV_LN2_N), _mm512_set1_pd(SHIFT));
            let ki = _mm512_castpd_si512(kd);
            let kd = _mm512_sub_pd(kd, _mm512_set1_pd(SHIFT));
            let r = _mm512_fmadd_pd(kd, _mm512_set1_pd(NEG_LN2_HI_N), x);
            let r = _mm512_fmadd_pd(kd, _mm512_set1_pd(NEG_LN2_LO_N), r);
            let idx = _mm512_slli_epi64::<1>(_mm512_and_si512(ki, _mm512_set1_epi64(127)));
            let base = TABLE.as_ptr() as *const i64;
            let tail = _mm512_castsi512_pd(_mm512_i64gather_epi64::<8>(idx, base));
            let sb = _mm512_i64gather_epi64::<8>(idx, base.add(1));
            let scale = _mm512_castsi512_pd(_mm512_add_epi64(sb, _mm512_slli_epi64::<45>(ki)));
            let r2 = _mm512_mul_pd(r, r);
            let lo = _mm512_fmadd_pd(r, _mm512_set1_pd(C3), _mm512_set1_pd(C2));
            let hi = _mm512_fmadd_pd(r, _mm512_set1_pd(C5), _mm512_set1_pd(C4));
            let tmp = _mm512_fmadd_pd(lo, r2, _mm512_add_pd(r, tail));
            let tmp = _mm512_fmadd_pd(_mm512_mul_pd(r2, r2), hi, tmp);
            let y = _mm512_fmadd_pd(scale, tmp, scale);
            let y = _mm512_mask_blend_pd(masked, y, _mm512_setzero_pd());
            _mm512_storeu_pd(o.as_mut_ptr(), y);
            patch(special & !masked, &a, t, m, o);
        }
        for &w in o.iter() {
            z += w;
        }
    }
    scalar(chunks.remainder(), t, m, outs.into_remainder(), z)
}

#[cfg(all(
    target_arch = "x86_64",
    target_env = "gnu",
    target_feature = "avx2",
    target_feature = "fma"
))]
#[target_feature(enable = "avx2,fma")]
fn lanes_avx2<L: Copy + Into<f64>>(l: &[L], t: f64, m: f64, out: &mut [f64]) -> f64 {
    let mut z = 0.0f64;
    let mut chunks = l.chunks_exact(4);
    let mut outs = out.chunks_exact_mut(4);
    let (tv, mv) = (_mm256_set1_pd(t), _mm256_set1_pd(m));
    let neg_inf = _mm256_set1_pd(f64::NEG_INFINITY);
    for (c, o) in (&mut chunks).zip(&mut outs) {
        let a = widen::<L, 4>(c);
        // SAFETY: `a` and `o` hold 4 f64; TABLE indices are < 256.
        unsafe {
            let raw = _mm256_loadu_pd(a.as_ptr());
            let is_neg_inf = _mm256_cmp_pd::<_CMP_EQ_OQ>(raw, neg_inf);
            let masked = _mm256_movemask_pd(is_neg_inf) as u8;
            if masked == 0xf {
                _mm256_storeu_pd(o.as_mut_ptr(), _mm256_setzero_pd());
                continue;
            }
            let x = _mm256_sub_pd(_mm256_div_pd(raw, tv), mv);
            let bits = _mm256_castpd_si256(x);
            let abstop = _mm256_and_si256(_mm256_srli_epi64::<52>(bits), _mm256_set1_epi64x(0x7ff));
            let off = _mm256_sub_epi64(abstop, _mm256_set1_epi64x(ABSTOP_LO as i64));
            // Unsigned `off > SPAN` as signed: `off > SPAN || off < 0`.
            let above = _mm256_cmpgt_epi64(off, _mm256_set1_epi64x(ABSTOP_SPAN as i64));
            let below = _mm256_cmpgt_epi64(_mm256_setzero_si256(), off);
            let special =
                _mm256_movemask_pd(_mm256_castsi256_pd(_mm256_or_si256(above, below))) as u8;
            let kd = _mm256_fmadd_pd(x, _mm256_set1_pd(INV_LN2_N), _mm256_set1_pd(SHIFT));
            let ki = _mm256_castpd_si256(kd);
            let kd = _mm256_sub_pd(kd, _mm256_set1_pd(SHIFT));
            let r = _mm256_fmadd_pd(kd, _mm256_set1_pd(NEG_LN2_HI_N), x);
            let r = _mm256_fmadd_pd(kd, _mm256_set1_pd(NEG_LN2_LO_N), r);
            let idx = _mm256_slli_epi64::<1>(_mm256_and_si256(ki, _mm256_set1_epi64x(127)));
            let base = TABLE.as_ptr() as *const i64;
            let tail = _mm256_castsi256_pd(_mm256_i64gather_epi64::<8>(base, idx));
            let sb = _mm256_i64gather_epi64::<8>(base.add(1), idx);
            let scale = _mm256_castsi256_pd(_mm256_add_epi64(sb, _mm256_slli_epi64::<45>(ki)));
            let r2 = _mm256_mul_pd(r, r);
            let lo = _mm256_fmadd_pd(r, _mm256_set1_pd(C3), _mm256_set1_pd(C2));
            let hi = _mm256_fmadd_pd(r, _mm256_set1_pd(C5), _mm256_set1_pd(C4));
            let tmp = _mm256_fmadd_pd(lo, r2, _mm256_add_pd(r, tail));
            let tmp = _mm256_fmadd_pd(_mm256_mul_pd(r2, r2), hi, tmp);
            let y = _mm256_fmadd_pd(scale, tmp, scale);
            let y = _mm256_blendv_pd(y, _mm256_setzero_pd(), is_neg_inf);
            _mm256_storeu_pd(o.as_mut_ptr(), y);
            patch(special & !masked, &a, t, m, o);
        }
        for &w in o.iter() {
            z += w;
        }
    }
    scalar(chunks.remainder(), t, m, outs.into_remainder(), z)
}

/// Lanes outside the table path (0 at the row's maximum, tiny or huge
/// arguments, underflow): the scalar call itself.
#[inline(always)]
fn patch(lanes: u8, a: &[f64], t: f64, m: f64, o: &mut [f64]) {
    let mut lanes = lanes;
    while lanes != 0 {
        let i = lanes.trailing_zeros() as usize;
        o[i] = weight(a[i], t, m);
        lanes &= lanes - 1;
    }
}

/// The table path in scalar code: the statement the lanes implement,
/// checked against libm on its own (`None` outside its range).
#[cfg(test)]
fn model(x: f64) -> Option<f64> {
    let abstop = (x.to_bits() >> 52) & 0x7ff;
    if abstop.wrapping_sub(ABSTOP_LO) > ABSTOP_SPAN {
        return None;
    }
    let kd = x.mul_add(INV_LN2_N, SHIFT);
    let ki = kd.to_bits();
    let kd = kd - SHIFT;
    let r = kd.mul_add(NEG_LN2_LO_N, kd.mul_add(NEG_LN2_HI_N, x));
    let i = 2 * (ki % 128) as usize;
    let tail = f64::from_bits(TABLE[i]);
    let scale = f64::from_bits(TABLE[i + 1].wrapping_add(ki << 45));
    let r2 = r * r;
    let tmp = (r2 * r2).mul_add(r.mul_add(C5, C4), r.mul_add(C3, C2).mul_add(r2, tail + r));
    Some(scale.mul_add(tmp, scale))
}

#[cfg(test)]
mod tests;
