//! Qwen4-Exp vision input against transformers 5.24 + Pillow 13
//! (`tools/oracle/qwen4_exp/generate_vl.py`, fixtures in
//! `tests/fixtures/qwen4_exp/vl/`).
//!
//! The processor: seven generated images (PNG, JPEG, lossless WebP, GIF,
//! RGBA PNG; scaled up, down and not at all). Lossless formats must decode to
//! Pillow's bytes exactly; the resize is Pillow's integer arithmetic, so the
//! pixel values must equal the reference bit for bit given the same decoded
//! bytes (the bound is 1e-5, the observed difference 0). JPEG decoders are
//! allowed to differ (the standard fixes the IDCT only to an accuracy, and
//! libjpeg-turbo's fancy chroma upsampling is its own): the test bounds the
//! decoded difference and checks the rest of the pipeline on Pillow's
//! decoded bytes.

use std::collections::HashMap;
use std::path::PathBuf;

use ds4_engine::backend::{Backend, CpuOps};
use ds4_engine::families::qwen4_exp::Qwen4ExpModel;
use ds4_engine::families::qwen4_exp::vision::processor::decode_rgb;
use ds4_engine::families::qwen4_exp::vision::{
    ImageSpan, ProcessorConfig, Rgb8, VisionTower, mrope_positions, process_image, process_rgb,
};
use ds4_engine::{LogitsRows, MediaChunk, Model, ModelState};
use safetensors::{Dtype, SafeTensors};

const TOL: f32 = 1e-5;
/// Logits: f32 through a 3-layer network in a different order than torch
/// (see tests/qwen4_exp.rs); observed ~1e-6.
const LOGITS_TOL: f32 = 1e-4;
const IMAGES: [&str; 7] = [
    "tiny.png",
    "exact.png",
    "wide.jpg",
    "tall.png",
    "lossless.webp",
    "anim.gif",
    "alpha.png",
];

fn vl() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/qwen4_exp/vl")
}

/// Tensors as (shape, raw little-endian bytes, dtype).
struct Tensors(HashMap<String, (Vec<usize>, Dtype, Vec<u8>)>);

impl Tensors {
    fn open(name: &str) -> Self {
        let bytes = std::fs::read(vl().join(name)).expect("fixture");
        let st = SafeTensors::deserialize(&bytes).expect("safetensors");
        Self(
            st.tensors()
                .into_iter()
                .map(|(k, v)| (k, (v.shape().to_vec(), v.dtype(), v.data().to_vec())))
                .collect(),
        )
    }
    fn f32(&self, k: &str) -> (Vec<usize>, Vec<f32>) {
        let (s, d, b) = &self.0[k];
        assert_eq!(*d, Dtype::F32, "{k}");
        (
            s.clone(),
            b.chunks_exact(4)
                .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
                .collect(),
        )
    }
    fn i64(&self, k: &str) -> Vec<i64> {
        let (_, d, b) = &self.0[k];
        assert_eq!(*d, Dtype::I64, "{k}");
        b.chunks_exact(8)
            .map(|c| i64::from_le_bytes(c.try_into().unwrap()))
            .collect()
    }
    fn rgb(&self, k: &str) -> Rgb8 {
        let (s, d, b) = &self.0[k];
        assert_eq!(*d, Dtype::U8, "{k}");
        Rgb8 {
            height: s[0],
            width: s[1],
            data: b.clone(),
        }
    }
}

fn processor_config() -> ProcessorConfig {
    let text = std::fs::read_to_string(vl().join("tiny_vl/preprocessor_config.json")).unwrap();
    ProcessorConfig::from_json(&text).unwrap()
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

#[test]
fn qwen4_vl_processor_matches_transformers_pil_backend() {
    let r = Tensors::open("processor.ref.safetensors");
    let cfg = processor_config();
    for name in IMAGES {
        let bytes = std::fs::read(vl().join("images").join(name)).unwrap();
        let pil_rgb = r.rgb(&format!("{name}.rgb"));
        let ours_rgb = decode_rgb(&bytes, cfg.max_decoded_pixels).unwrap();
        assert_eq!(
            (ours_rgb.width, ours_rgb.height),
            (pil_rgb.width, pil_rgb.height),
            "{name}: size"
        );
        let decode_diff = ours_rgb
            .data
            .iter()
            .zip(&pil_rgb.data)
            .map(|(a, b)| a.abs_diff(*b))
            .max()
            .unwrap_or(0);
        let (shape, want) = r.f32(&format!("{name}.pixel_values"));
        let grid = r.i64(&format!("{name}.grid_thw"));
        // The pipeline after decoding, on Pillow's bytes: exact.
        let from_pil = process_rgb(&pil_rgb, &cfg).unwrap();
        assert_eq!(
            from_pil.grid_thw.map(|v| v as i64).to_vec(),
            grid,
            "{name}: grid"
        );
        assert_eq!(
            shape,
            vec![from_pil.grid_thw[1] * from_pil.grid_thw[2], cfg.patch_dim()],
            "{name}: shape"
        );
        let d_pipeline = max_diff(&from_pil.pixel_values, &want);
        // From the file's bytes, our decoder included.
        let ours = process_image(&bytes, &cfg).unwrap();
        let d_file = max_diff(&ours.pixel_values, &want);
        println!(
            "{name}: {}x{} -> {:?} grid {:?} tokens {}; decode max |Δ| {decode_diff} levels; pixel values: pipeline {d_pipeline:.3e}, from file {d_file:.3e}",
            pil_rgb.width, pil_rgb.height, ours.resized, ours.grid_thw, ours.merged_tokens
        );
        assert!(d_pipeline <= TOL, "{name}: pipeline {d_pipeline}");
        if name.ends_with(".jpg") {
            // Different conforming JPEG decoders (zune-jpeg vs Pillow's
            // libjpeg-turbo: IDCT and chroma upsampling): bounded, reported.
            let mean = ours_rgb
                .data
                .iter()
                .zip(&pil_rgb.data)
                .map(|(a, b)| f64::from(a.abs_diff(*b)))
                .sum::<f64>()
                / pil_rgb.data.len() as f64;
            println!("{name}: JPEG decode mean |Δ| {mean:.3} levels, max {decode_diff}");
            assert!(
                decode_diff <= 16 && mean < 1.0,
                "{name}: decoder differs by {decode_diff} levels (mean {mean})"
            );
        } else {
            assert_eq!(
                decode_diff, 0,
                "{name}: lossless decode differs from Pillow"
            );
            assert!(d_file <= TOL, "{name}: from file {d_file}");
        }
    }
}

const IMAGE_PAD: i64 = 126;
const PROMPTS: usize = 3;

/// Each prompt's images (processed from Pillow's decoded bytes, so a JPEG
/// decoder difference does not reach the features) and spans.
fn prompt_images(
    r: &Tensors,
    t: &Tensors,
    k: usize,
    cfg: &ProcessorConfig,
) -> Vec<(
    ds4_engine::families::qwen4_exp::vision::ProcessedImage,
    ImageSpan,
)> {
    let ids = t.i64(&format!("p{k}.input_ids"));
    let firsts: Vec<usize> = (0..ids.len())
        .filter(|&i| ids[i] == IMAGE_PAD && (i == 0 || ids[i - 1] != IMAGE_PAD))
        .collect();
    let which = t.i64(&format!("p{k}.images"));
    assert_eq!(firsts.len(), which.len());
    which
        .iter()
        .zip(firsts)
        .map(|(&w, first)| {
            let img = process_rgb(&r.rgb(&format!("{}.rgb", IMAGES[w as usize])), cfg).unwrap();
            let span = ImageSpan {
                first,
                grid_thw: img.grid_thw,
            };
            (img, span)
        })
        .collect()
}

#[test]
fn qwen4_vl_mrope_positions_match_get_rope_index() {
    let r = Tensors::open("processor.ref.safetensors");
    let t = Tensors::open("tiny_vl.ref.safetensors");
    let cfg = processor_config();
    for k in 0..PROMPTS {
        let len = t.i64(&format!("p{k}.input_ids")).len();
        let spans: Vec<ImageSpan> = prompt_images(&r, &t, k, &cfg)
            .into_iter()
            .map(|(_, s)| s)
            .collect();
        let (pos, delta) = mrope_positions(len, &spans, cfg.merge_size).unwrap();
        let want = t.i64(&format!("p{k}.position_ids"));
        for axis in 0..3 {
            let ours: Vec<i64> = pos.iter().map(|p| p[axis]).collect();
            assert_eq!(ours, want[axis * len..(axis + 1) * len], "p{k} axis {axis}");
        }
        assert_eq!(delta, t.i64(&format!("p{k}.rope_delta"))[0], "p{k} delta");
        println!("p{k}: {len} tokens, {} images, delta {delta}", spans.len());
    }
}

#[test]
fn qwen4_vl_tower_features_match_transformers() {
    let r = Tensors::open("processor.ref.safetensors");
    let t = Tensors::open("tiny_vl.ref.safetensors");
    let cfg = processor_config();
    let ops = CpuOps;
    let tower = VisionTower::load(&vl().join("tiny_vl"), ops)
        .unwrap()
        .expect("a VL checkpoint");
    let out = tower.config().out_hidden_size;
    let c = tower.config();
    assert_eq!(
        (
            c.image_token_id,
            c.vision_start_token_id,
            c.vision_end_token_id
        ),
        (IMAGE_PAD as u32, 124, 125)
    );
    for k in 0..PROMPTS {
        let mut ours = Vec::new();
        let (_, want) = t.f32(&format!("p{k}.vision_features"));
        for (img, _) in prompt_images(&r, &t, k, &cfg) {
            let f = ops.download(&tower.forward(&img).unwrap()).unwrap();
            assert_eq!(f.len(), img.merged_tokens * out);
            let d = max_diff(&f, &want[ours.len()..ours.len() + f.len()]);
            println!("p{k}: image grid {:?}: max |Δ| {d:.3e}", img.grid_thw);
            ours.extend(f);
        }
        let (shape, want) = t.f32(&format!("p{k}.vision_features"));
        assert_eq!(shape, vec![ours.len() / out, out]);
        let d = max_diff(&ours, &want);
        let scale = want.iter().fold(0f32, |m, v| m.max(v.abs()));
        println!("p{k}: vision features max |Δ| {d:.3e} (values up to {scale:.2})");
        assert!(d <= TOL, "p{k}: vision features differ by {d}");
    }
}

/// One prompt ready for the model: ids, per-image features (host rows) with
/// their spans, and the whole prompt's M-RoPE positions.
struct Prompt {
    ids: Vec<u32>,
    images: Vec<(ImageSpan, Vec<f32>)>,
    positions: Vec<[u32; 3]>,
    width: usize,
}

impl Prompt {
    fn build(
        k: usize,
        tower: &VisionTower<CpuOps>,
        r: &Tensors,
        t: &Tensors,
        cfg: &ProcessorConfig,
    ) -> Self {
        let ids: Vec<u32> = t
            .i64(&format!("p{k}.input_ids"))
            .iter()
            .map(|&v| v as u32)
            .collect();
        let images: Vec<(ImageSpan, Vec<f32>)> = prompt_images(r, t, k, cfg)
            .into_iter()
            .map(|(img, span)| {
                (
                    span,
                    CpuOps.download(&tower.forward(&img).unwrap()).unwrap(),
                )
            })
            .collect();
        let spans: Vec<ImageSpan> = images.iter().map(|(s, _)| *s).collect();
        let (pos, _) = mrope_positions(ids.len(), &spans, cfg.merge_size).unwrap();
        let positions = pos.iter().map(|p| p.map(|v| v as u32)).collect();
        Self {
            ids,
            images,
            positions,
            width: tower.config().out_hidden_size,
        }
    }

    /// The media of tokens `s .. s + n`: each image's rows that fall inside.
    fn chunk_spans(&self, s: usize, n: usize) -> Vec<(usize, &[f32])> {
        let merge = 2;
        self.images
            .iter()
            .filter_map(|(span, f)| {
                let (a, b) = (span.first, span.first + span.tokens(merge));
                let (lo, hi) = (a.max(s), b.min(s + n));
                (lo < hi).then(|| (lo - s, &f[(lo - a) * self.width..(hi - a) * self.width]))
            })
            .collect()
    }

    /// Logits of every row, fed in `chunks`.
    fn run(
        &self,
        model: &Qwen4ExpModel<CpuOps>,
        state: &mut <Qwen4ExpModel<CpuOps> as Model>::State,
        chunks: &[usize],
    ) -> Vec<f32> {
        let mut out = Vec::new();
        let mut s = 0;
        for &n in chunks {
            let spans = self.chunk_spans(s, n);
            let media = MediaChunk {
                spans: &spans,
                positions: &self.positions[s..s + n],
            };
            out.extend(
                model
                    .forward_media(&self.ids[s..s + n], &media, state, LogitsRows::All)
                    .unwrap()
                    .logits,
            );
            s += n;
        }
        assert_eq!(s, self.ids.len());
        out
    }
}

fn vl_model() -> (Qwen4ExpModel<CpuOps>, VisionTower<CpuOps>) {
    let dir = vl().join("tiny_vl");
    (
        Qwen4ExpModel::load(&dir, CpuOps).unwrap(),
        VisionTower::load(&dir, CpuOps).unwrap().unwrap(),
    )
}

#[test]
fn qwen4_vl_logits_with_images_match_transformers() {
    let r = Tensors::open("processor.ref.safetensors");
    let t = Tensors::open("tiny_vl.ref.safetensors");
    let cfg = processor_config();
    let (model, tower) = vl_model();
    for k in 0..PROMPTS {
        let p = Prompt::build(k, &tower, &r, &t, &cfg);
        let len = p.ids.len();
        let check = |what: &str, got: &[f32], key: &str| {
            let (_, want) = t.f32(&format!("p{k}.{key}"));
            let d = max_diff(got, &want);
            println!("p{k} {what}: max |Δ| {d:.3e}");
            assert!(d <= LOGITS_TOL, "p{k} {what}: {d}");
        };
        // Single shot, with the QSA selections traced.
        let mut state = model.new_state();
        let spans = p.chunk_spans(0, len);
        let media = MediaChunk {
            spans: &spans,
            positions: &p.positions,
        };
        let out = model
            .forward_media_ext(&p.ids, &media, &mut state, LogitsRows::All, true)
            .unwrap();
        check("single shot", &out.logits.logits, "logits_full");
        let mut qsa = 0;
        for (l, tr) in out.trace.iter().enumerate() {
            let Some(sel) = &tr.qsa else { continue };
            qsa += 1;
            let want = t.i64(&format!("p{k}.layer{l}_qsa_selected"));
            let mut pruned = 0;
            for (i, keep) in sel.iter().enumerate() {
                let exp: Vec<u32> = (0..len as u32)
                    .filter(|&j| want[i * len + j as usize] == 1)
                    .collect();
                assert_eq!(
                    keep, &exp,
                    "p{k} layer {l} query {i}: QSA selection differs with images"
                );
                pruned += i + 1 - keep.len();
            }
            // The selection really prunes: not the no-pruning (causal) one.
            assert!(pruned > 0, "p{k} layer {l}: nothing pruned");
            println!("p{k} layer {l}: QSA selection identical, {pruned} causal pairs pruned");
        }
        assert!(qsa > 0);
        // Decode after the prompt: text positions continue at len + delta.
        let dec: Vec<u32> = t
            .i64(&format!("p{k}.decode_ids"))
            .iter()
            .map(|&v| v as u32)
            .collect();
        let mut rows = Vec::new();
        for &d in &dec {
            rows.extend(
                model
                    .forward(&[d], &mut state, LogitsRows::All)
                    .unwrap()
                    .logits,
            );
        }
        check("decode after the prompt", &rows, "logits_decode");
        // Chunks cutting through the first image (#108), then steps.
        let chunks: Vec<usize> = t
            .i64(&format!("p{k}.chunks"))
            .iter()
            .map(|&v| v as usize)
            .collect();
        let got = p.run(&model, &mut model.new_state(), &chunks);
        check(&format!("chunks {chunks:?}"), &got, "logits_chunked");
        let pre = t.i64(&format!("p{k}.steps_prefill"))[0] as usize;
        let steps: Vec<usize> = std::iter::once(pre)
            .chain(std::iter::repeat_n(1, len - pre))
            .collect();
        let got = p.run(&model, &mut model.new_state(), &steps);
        check(&format!("prefill {pre} then steps"), &got, "logits_steps");
        // Every chunk boundary: bit-identical to single shot (the op
        // inventory's row-count independence), so every cut through an
        // image is as good as the reference cut above.
        for cut in 1..len {
            let got = p.run(&model, &mut model.new_state(), &[cut, len - cut]);
            assert_eq!(got, out.logits.logits, "p{k}: cut at {cut} changes bits");
        }
    }
}

#[test]
fn qwen4_vl_warm_equals_cold_and_snapshots_keep_image_positions() {
    let r = Tensors::open("processor.ref.safetensors");
    let t = Tensors::open("tiny_vl.ref.safetensors");
    let cfg = processor_config();
    let (model, tower) = vl_model();
    let p = Prompt::build(1, &tower, &r, &t, &cfg);
    let len = p.ids.len();
    let tail: Vec<u32> = vec![5, 9, 17, 33];
    // Cold: the prompt then the tail in one state.
    let mut cold = model.new_state();
    p.run(&model, &mut cold, &[len]);
    let cold_rows = model
        .forward(&tail, &mut cold, LogitsRows::All)
        .unwrap()
        .logits;
    // Warm: a snapshot after the prompt, exported and imported, restored,
    // then the same tail.
    let mut warm = model.new_state();
    p.run(&model, &mut warm, &[7, len - 7]);
    let table = warm.export().unwrap();
    let mut imported = model.new_state();
    imported.import(table).unwrap();
    let snap = imported.snapshot();
    model
        .forward(&[1, 2, 3], &mut imported, LogitsRows::Last)
        .unwrap();
    imported.restore(&snap);
    let warm_rows = model
        .forward(&tail, &mut imported, LogitsRows::All)
        .unwrap()
        .logits;
    assert_eq!(warm_rows, cold_rows, "warm != cold with images");
}

/// The vision tower's share of a prefill with images (ignored by default: a
/// speed measurement, not a test):
///
/// ```text
/// cargo nextest run --workspace --release --run-ignored only -E 'test(/qwen4_vl_bench/)' --no-capture
/// ```
#[test]
#[ignore = "speed measurement; run explicitly in release"]
fn qwen4_vl_bench_tower_share_of_prefill() {
    use std::time::Instant;
    let r = Tensors::open("processor.ref.safetensors");
    let t = Tensors::open("tiny_vl.ref.safetensors");
    let cfg = processor_config();
    let (model, tower) = vl_model();
    for k in 0..PROMPTS {
        let imgs = prompt_images(&r, &t, k, &cfg);
        let reps = 20;
        let start = Instant::now();
        for _ in 0..reps {
            for (img, _) in &imgs {
                CpuOps.download(&tower.forward(img).unwrap()).unwrap();
            }
        }
        let tower_s = start.elapsed().as_secs_f64() / reps as f64;
        let p = Prompt::build(k, &tower, &r, &t, &cfg);
        let start = Instant::now();
        for _ in 0..reps {
            p.run(&model, &mut model.new_state(), &[p.ids.len()]);
        }
        let trunk_s = start.elapsed().as_secs_f64() / reps as f64;
        let patches: usize = imgs
            .iter()
            .map(|(i, _)| i.grid_thw.iter().product::<usize>())
            .sum();
        println!(
            "p{k}: {} tokens, {patches} patches: tower {:.3} ms, trunk prefill {:.3} ms, tower share {:.1}%",
            p.ids.len(),
            tower_s * 1e3,
            trunk_s * 1e3,
            100.0 * tower_s / (tower_s + trunk_s)
        );
    }
}

/// An MTP verify window after an image prompt sees the same positions as
/// AR steps (text continues at index + delta): window rows equal step rows
/// bit for bit, and after committing part of a window the next window
/// continues where the steps did.
#[test]
fn qwen4_vl_verify_windows_and_commits_match_steps_after_images() {
    let r = Tensors::open("processor.ref.safetensors");
    let t = Tensors::open("tiny_vl.ref.safetensors");
    let cfg = processor_config();
    let (model, tower) = vl_model();
    for k in 0..PROMPTS {
        let p = Prompt::build(k, &tower, &r, &t, &cfg);
        let tail: Vec<u32> = vec![7, 40, 3, 99, 12];
        let mut ar = model.new_state();
        p.run(&model, &mut ar, &[p.ids.len()]);
        let steps: Vec<Vec<f32>> = tail
            .iter()
            .map(|&tok| {
                model
                    .forward(&[tok], &mut ar, LogitsRows::All)
                    .unwrap()
                    .logits
            })
            .collect();
        let mut spec = model.new_state();
        p.run(&model, &mut spec, &[p.ids.len()]);
        let w = Model::forward_window(&model, &tail[..4], &mut spec).unwrap();
        assert_eq!(
            w.logits.logits,
            steps[..4].concat(),
            "p{k}: window rows != steps"
        );
        spec.commit(&w.record, 2).unwrap();
        assert_eq!(spec.len(), p.ids.len() + 2);
        let w = Model::forward_window(&model, &tail[2..], &mut spec).unwrap();
        assert_eq!(w.logits.logits, steps[2..].concat(), "p{k}: after a commit");
    }
}

/// The vision tower's share of a prefill on a medium random model (ignored
/// by default: a speed measurement). Synthetic weights
/// ([`ds4_engine::load::synthetic::SyntheticSource`]: 4-bit projections,
/// small f32 elsewhere) at transformers' default vision tower (27 blocks,
/// width 1152, 16 heads, MLP 4304) feeding an 8-layer trunk of width 1024
/// (the real text configuration shrunk: 64 experts, top 8); one image of
/// each size with 128 text tokens before and after it.
///
/// ```text
/// cargo nextest run --workspace --release --run-ignored only -E 'test(/qwen4_vl_bench_medium/)' --no-capture
/// ```
#[test]
#[ignore = "speed measurement; run explicitly in release"]
fn qwen4_vl_bench_medium_tower_share_of_prefill() {
    use ds4_engine::families::qwen4_exp::Qwen4ExpConfig;
    use ds4_engine::families::qwen4_exp::vision::VisionConfig;
    use ds4_engine::load::synthetic::{SyntheticSource, shape_config};
    use std::time::Instant;

    let mut text = shape_config("qwen4_exp", "full").unwrap();
    for (k, v) in [
        ("hidden_size", 1024),
        ("num_hidden_layers", 8),
        ("num_experts", 64),
        ("num_experts_per_tok", 8),
        ("moe_intermediate_size", 512),
        ("shared_expert_intermediate_size", 512),
        ("num_attention_heads", 8),
        ("linear_num_key_heads", 8),
        ("linear_num_value_heads", 16),
        ("ple_embed_dim", 1024),
        ("hc_lowrank", 128),
    ] {
        text[k] = serde_json::json!(v);
    }
    text["model_type"] = serde_json::json!("qwen4_exp_text");
    let config = serde_json::json!({
        "model_type": "qwen4_exp",
        "image_token_id": 248056,
        "vision_start_token_id": 248053,
        "vision_end_token_id": 248054,
        "text_config": text,
        "vision_config": {
            "depth": 27, "hidden_size": 1152, "intermediate_size": 4304, "num_heads": 16,
            "patch_size": 16, "temporal_patch_size": 2, "spatial_merge_size": 2,
            "in_channels": 3, "out_hidden_size": 1024, "num_position_embeddings": 2304,
            "hidden_act": "gelu_pytorch_tanh"
        }
    });
    let path = PathBuf::from("synthetic:qwen4_exp-medium-vl");
    let parsed = Qwen4ExpConfig::from_hf(&path, &config).unwrap();
    let mut src = SyntheticSource::new(7, false, "qwen4_exp-medium-vl");
    let model = Qwen4ExpModel::load_from(&mut src, &path, parsed, CpuOps).unwrap();
    let vcfg = VisionConfig::from_hf(&path, &config).unwrap().unwrap();
    let tower = VisionTower::load_from(&mut src, vcfg.clone(), CpuOps).unwrap();
    let pcfg = ProcessorConfig::from_json(
        r#"{"image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5], "merge_size": 2,
            "patch_size": 16, "temporal_patch_size": 2,
            "size": {"longest_edge": 16777216, "shortest_edge": 65536}}"#,
    )
    .unwrap();
    // (Larger images outgrow the 4-minute test limit on a 2-core machine:
    // the tower's attention grows with the square of its patches.)
    for (h, w) in [(256, 256), (512, 384)] {
        let data: Vec<u8> = (0..h * w * 3).map(|i| (i * 7 % 251) as u8).collect();
        let img = process_rgb(
            &Rgb8 {
                height: h,
                width: w,
                data,
            },
            &pcfg,
        )
        .unwrap();
        let t0 = Instant::now();
        let features = CpuOps.download(&tower.forward(&img).unwrap()).unwrap();
        let tower_s = t0.elapsed().as_secs_f64();
        let span = ImageSpan {
            first: 129,
            grid_thw: img.grid_thw,
        };
        let n = span.tokens(2);
        let mut ids: Vec<u32> = (0..128).map(|i| 1000 + i * 13).collect();
        ids.push(vcfg.vision_start_token_id);
        ids.extend(std::iter::repeat_n(vcfg.image_token_id, n));
        ids.push(vcfg.vision_end_token_id);
        ids.extend((0..128).map(|i| 2000 + i * 17));
        let (pos, _) = mrope_positions(ids.len(), &[span], 2).unwrap();
        let positions: Vec<[u32; 3]> = pos.iter().map(|p| p.map(|v| v as u32)).collect();
        let spans = [(129usize, &features[..])];
        let media = MediaChunk {
            spans: &spans,
            positions: &positions,
        };
        let t0 = Instant::now();
        let out = model
            .forward_media(&ids, &media, &mut model.new_state(), LogitsRows::Last)
            .unwrap();
        let trunk_s = t0.elapsed().as_secs_f64();
        assert!(out.logits.iter().all(|x| x.is_finite()));
        let mp = (img.grid_thw[1] * img.grid_thw[2] * 256) as f64 / 1e6;
        println!(
            "{h}x{w} image ({mp:.3} MP after resize, {n} image tokens, {:.0} per MP), {} prompt tokens: tower {:.1} ms, trunk prefill {:.1} ms, tower share {:.1}%",
            n as f64 / mp,
            ids.len(),
            tower_s * 1e3,
            trunk_s * 1e3,
            100.0 * tower_s / (tower_s + trunk_s)
        );
    }
}
