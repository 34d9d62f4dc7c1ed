//! The conformance suite's exactness properties on the CUDA fast set, for
//! the families whose fast set has arithmetic of its own beyond the CPU
//! fast set's products (DeepSeek-V4 and GLM-5: the mHC `fn` projection,
//! `kernels/hc_fn.cu`) and the ones whose products it rounds (ds4's GGUF,
//! Qwen and GLM in GGUF blocks): one forward == chunks == single steps, a
//! warm turn == a cold one (AR and MTP, greedy and sampled), every
//! committed prefix of a verify window == the shorter forward, greedy MTP
//! == greedy AR. The fast set's bits are its own, so each model is checked
//! against itself, as `e2e.rs` checks the reference set.

use ds4_engine::backend::KernelSet;
use ds4_engine::families::deepseek_v4::DeepseekV4Model;
use ds4_engine::families::glm5_next::Glm5NextModel;
use ds4_engine::families::qwen4_exp::Qwen4ExpModel;

use crate::e2e::{exactness, fixtures};
use crate::ops::kq8::fast_gpu;

#[test]
#[ignore = "needs an NVIDIA GPU: run with --ignored (docs/GPU.md)"]
fn cuda_fast_set_is_exact_for_the_mhc_families_and_gguf_blocks() {
    let g = fast_gpu();
    assert_eq!(g.kernel_set(), KernelSet::Fast);
    let f = fixtures();
    for name in ["tiny_a", "tiny_b"] {
        let m = DeepseekV4Model::load(&f.join("deepseek_v4").join(name), g.clone()).unwrap();
        exactness(&format!("fast deepseek_v4 {name}"), &m);
    }
    let gguf = f.join("deepseek_v4/ds4_gguf");
    let m = DeepseekV4Model::load_gguf(
        &gguf.join("model.gguf"),
        Some(&gguf.join("mtp.gguf")),
        g.clone(),
    )
    .unwrap();
    exactness("fast deepseek_v4 ds4 gguf", &m);
    let m = Glm5NextModel::load(&f.join("glm5_next/tiny_a"), g.clone()).unwrap();
    exactness("fast glm5_next tiny_a", &m);
    let m = Glm5NextModel::load(&f.join("hf_gguf/glm5_next_tiny_a.gguf"), g.clone()).unwrap();
    exactness("fast glm5_next hf gguf", &m);
    let m = Qwen4ExpModel::load(&f.join("hf_gguf/qwen4_exp_tiny_a.gguf"), g).unwrap();
    exactness("fast qwen4_exp hf gguf", &m);
}
