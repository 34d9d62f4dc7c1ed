//! Sessions with images on the tiny `qwen4_exp` VL fixture, through the
//! session cache the server uses (`decode_turn_with_media`): a prompt's
//! identity is its tokens plus each image's SHA-256 over its span
//! (`media_keys`), so a warm turn with images equals a cold one bit for bit
//! (AR and MTP, greedy and sampled), a changed or swapped image misses from
//! its span's first token, a checkpoint written with images restores warm
//! and a changed image gets nothing from it; greedy MTP equals AR with
//! images in the prompt.

use std::io::Cursor;
use std::path::PathBuf;

use ds4_engine::backend::{Backend, CpuOps};
use ds4_engine::decode::{
    KeyedSpan, PromptMedia, TurnConfig, TurnRequest, TurnResult, media::Encode, media_keys,
};
use ds4_engine::families::qwen4_exp::Qwen4ExpModel;
use ds4_engine::families::qwen4_exp::vision::{
    ImageSpan, ProcessedImage, ProcessorConfig, VisionTower, mrope_positions, process_image,
};
use ds4_engine::state::warm::{CacheSource, CheckpointConfig, SessionCache};
use ds4_sampling::{Law, Sampler, SamplingParams};
use sha2::{Digest, Sha256};

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/qwen4_exp/vl")
}

struct Fixture {
    model: Qwen4ExpModel,
    tower: VisionTower<CpuOps>,
    processor: ProcessorConfig,
}

fn fixture() -> Fixture {
    let d = dir().join("tiny_vl");
    let text = std::fs::read_to_string(d.join("preprocessor_config.json")).unwrap();
    Fixture {
        model: Qwen4ExpModel::from_hf_dir(&d).unwrap(),
        tower: VisionTower::load(&d, CpuOps).unwrap().unwrap(),
        processor: ProcessorConfig::from_json(&text).unwrap(),
    }
}

fn file(name: &str) -> Vec<u8> {
    std::fs::read(dir().join("images").join(name)).unwrap()
}

/// A 96x64 PNG (the grid of `exact.png`) with other pixels.
fn other_png() -> Vec<u8> {
    let img =
        image::RgbImage::from_fn(96, 64, |x, y| image::Rgb([(x * 2) as u8, (y * 3) as u8, 7]));
    let mut out = Cursor::new(Vec::new());
    img.write_to(&mut out, image::ImageFormat::Png).unwrap();
    out.into_inner()
}

#[derive(Clone)]
enum Part {
    Text(Vec<u32>),
    Image(Vec<u8>),
}

fn text(seed: u32, n: u32) -> Part {
    Part::Text((0..n).map(|i| 3 + (seed * 31 + i * 17) % 120).collect())
}

/// A prompt: keys, real ids, images and their spans.
struct Prompt {
    keys: Vec<u32>,
    tokens: Vec<u32>,
    images: Vec<ProcessedImage>,
    spans: Vec<ImageSpan>,
    /// Where each image's keyed span (start marker) begins.
    starts: Vec<usize>,
}

impl Fixture {
    fn prompt(&self, parts: &[Part]) -> Prompt {
        let c = self.tower.config();
        let (mut tokens, mut images, mut spans, mut keyed) = (vec![], vec![], vec![], vec![]);
        for p in parts {
            match p {
                Part::Text(t) => tokens.extend_from_slice(t),
                Part::Image(bytes) => {
                    let img = process_image(bytes, &self.processor).unwrap();
                    keyed.push(KeyedSpan {
                        first: tokens.len(),
                        len: img.merged_tokens + 1,
                        sha256: Sha256::digest(bytes).into(),
                    });
                    tokens.push(c.vision_start_token_id);
                    spans.push(ImageSpan {
                        first: tokens.len(),
                        grid_thw: img.grid_thw,
                    });
                    tokens.extend(std::iter::repeat_n(c.image_token_id, img.merged_tokens));
                    tokens.push(c.vision_end_token_id);
                    images.push(img);
                }
            }
        }
        Prompt {
            keys: media_keys(&tokens, &keyed).unwrap(),
            starts: keyed.iter().map(|k| k.first).collect(),
            tokens,
            images,
            spans,
        }
    }

    fn media<'a>(&self, p: &Prompt, encode: &'a Encode<'a>) -> PromptMedia<'a> {
        let merge = self.tower.config().spatial_merge_size;
        let (pos, _) = mrope_positions(p.tokens.len(), &p.spans, merge).unwrap();
        PromptMedia::new(
            p.tokens.clone(),
            pos.iter().map(|q| q.map(|v| v as u32)).collect(),
            self.tower.config().out_hidden_size,
            p.spans.iter().map(|s| (s.first, s.tokens(merge))).collect(),
            encode,
        )
    }

    /// One turn through `cache`: (result, the session's last logits row).
    fn turn(
        &self,
        cache: &mut SessionCache<Qwen4ExpModel>,
        p: &Prompt,
        temperature: f64,
        depth: usize,
        max_tokens: usize,
    ) -> (TurnResult, Vec<f32>) {
        let encode = |i: usize| CpuOps.download(&self.tower.forward(&p.images[i])?);
        let media = self.media(p, &encode);
        let params = SamplingParams {
            temperature,
            ..Law::Nucleus.default_params()
        };
        let mut sampler = Sampler::new(Law::Nucleus, params, 11).unwrap();
        let request = TurnRequest {
            prompt: &p.keys,
            sampler: &mut sampler,
            config: TurnConfig {
                max_tokens,
                stop_token_ids: vec![],
                prefill_chunk: 5,
                logprobs: None,
                cancel: Default::default(),
            },
            mtp_depth: Some(depth),
        };
        cache.prepare(&self.model, &p.keys, Some(depth));
        let r = cache
            .decode_turn_with_media(&self.model, request, Some(&media), &mut ())
            .unwrap();
        cache.finish(Some(&r));
        let logits = cache.live().last_logits().unwrap().to_vec();
        (r, logits)
    }
}

fn cache(f: &Fixture, every: usize) -> SessionCache<Qwen4ExpModel> {
    SessionCache::new(&f.model, 1 << 30).with_boundary_every(every)
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

#[test]
fn warm_turns_with_images_equal_cold_bit_for_bit() {
    let f = fixture();
    let first = vec![text(1, 5), Part::Image(file("exact.png")), text(2, 4)];
    for (temperature, depth) in [(0.0, 0), (1.0, 0), (0.0, 2), (1.0, 2)] {
        let mut warm = cache(&f, 7);
        let (r1, _) = f.turn(&mut warm, &f.prompt(&first), temperature, depth, 4);
        let mut parts = first.clone();
        parts.push(Part::Text(r1.tokens.clone()));
        parts.extend([text(3, 3), Part::Image(file("wide.jpg")), text(4, 2)]);
        let p2 = f.prompt(&parts);
        let (w, wl) = f.turn(&mut warm, &p2, temperature, depth, 6);
        let (c, cl) = f.turn(&mut cache(&f, 7), &p2, temperature, depth, 6);
        assert!(
            w.reused_tokens > p2.starts[0],
            "T={temperature} depth {depth}: not warm"
        );
        assert_eq!(c.reused_tokens, 0);
        assert_eq!(w.tokens, c.tokens, "T={temperature} depth {depth}");
        assert_eq!(
            bits(&wl),
            bits(&cl),
            "T={temperature} depth {depth}: logits differ"
        );
        println!(
            "T={temperature} depth {depth}: warm reused {} of {}, {:?}",
            w.reused_tokens,
            p2.keys.len(),
            w.tokens
        );
    }
}

#[test]
fn greedy_mtp_equals_ar_with_images() {
    let f = fixture();
    let p = f.prompt(&[
        text(5, 3),
        Part::Image(file("tall.png")),
        text(6, 2),
        Part::Image(file("exact.png")),
        text(7, 3),
    ]);
    let (ar, arl) = f.turn(&mut cache(&f, 0), &p, 0.0, 0, 16);
    for depth in 1..=3 {
        let (mtp, mtpl) = f.turn(&mut cache(&f, 0), &p, 0.0, depth, 16);
        assert_eq!(mtp.tokens, ar.tokens, "depth {depth}");
        assert_eq!(bits(&mtpl), bits(&arl), "depth {depth}");
        let m = mtp.mtp.unwrap();
        println!("depth {depth}: {:?}, accepted {:?}", mtp.tokens, m.accepted);
    }
}

#[test]
fn a_changed_or_swapped_image_misses_from_its_span() {
    let f = fixture();
    let (x, y, z) = (file("exact.png"), file("tiny.png"), other_png());
    let build = |a: &[u8], b: &[u8]| {
        f.prompt(&[
            text(1, 4),
            Part::Image(a.to_vec()),
            text(2, 3),
            Part::Image(b.to_vec()),
            text(3, 2),
        ])
    };
    let xy = build(&x, &y);
    // A boundary at every prompt token: reuse is exactly the common key prefix.
    let mut c = cache(&f, 1);
    f.turn(&mut c, &xy, 0.0, 0, 1);
    // The same images: all of it.
    let same = c.prepare(&f.model, &xy.keys, Some(0));
    assert_eq!(same.cached_tokens, xy.keys.len());
    // Same size, other pixels, second image: up to its span.
    let xz = build(&x, &z);
    assert_eq!(xz.tokens, build(&x, &x).tokens);
    let changed = c.prepare(&f.model, &xz.keys, Some(0));
    assert_eq!(changed.cached_tokens, xy.starts[1]);
    // Swapped: up to the first span.
    let yx = build(&y, &x);
    assert_eq!(
        c.prepare(&f.model, &yx.keys, Some(0)).cached_tokens,
        xy.starts[0]
    );
    // The changed image's turn equals a cold one.
    c.prepare(&f.model, &xy.keys, Some(0));
    let (w, wl) = f.turn(&mut c, &xz, 0.0, 0, 3);
    let (k, kl) = f.turn(&mut cache(&f, 1), &xz, 0.0, 0, 3);
    assert_eq!(w.reused_tokens, xy.starts[1]);
    assert_eq!((w.tokens, bits(&wl)), (k.tokens, bits(&kl)));
}

#[test]
fn checkpoints_with_images_restore_warm_and_a_changed_image_gets_nothing() {
    let f = fixture();
    let tmp = tempfile::tempdir().unwrap();
    let cfg = CheckpointConfig {
        dir: tmp.path().to_path_buf(),
        model_path: dir().join("tiny_vl"),
        budget: 1 << 30,
        min_tokens: 1,
    };
    let open = || {
        SessionCache::open(&f.model, 1 << 30, Some(&cfg))
            .unwrap()
            .with_boundary_every(0)
    };
    let first = vec![text(8, 4), Part::Image(file("exact.png")), text(9, 3)];
    let (r1, _) = {
        let mut c = open();
        let r = f.turn(&mut c, &f.prompt(&first), 0.0, 0, 3);
        c.shutdown();
        r
    };
    let mut parts = first.clone();
    parts.push(Part::Text(r1.tokens.clone()));
    parts.push(text(10, 3));
    let next = f.prompt(&parts);
    let mut c = open();
    let hit = c.prepare(&f.model, &next.keys, Some(0));
    assert_eq!(hit.source, CacheSource::Disk);
    assert_eq!(
        hit.cached_tokens,
        f.prompt(&first).keys.len() + r1.tokens.len()
    );
    let (w, wl) = f.turn(&mut c, &next, 0.0, 0, 4);
    let (k, kl) = f.turn(&mut cache(&f, 0), &next, 0.0, 0, 4);
    assert_eq!((w.tokens, bits(&wl)), (k.tokens, bits(&kl)));
    // The same conversation with another image of the same size.
    let mut changed = parts.clone();
    changed[1] = Part::Image(other_png());
    let changed = f.prompt(&changed);
    assert_eq!(changed.tokens, next.tokens);
    let mut c = open();
    let misses = c.stats().misses;
    let miss = c.prepare(&f.model, &changed.keys, Some(0));
    assert_eq!(miss.source, CacheSource::Cold);
    assert_eq!(miss.cached_tokens, 0);
    assert_eq!(c.stats().misses, misses + 1);
}
