//! Stream parity: NumPy's `default_rng(seed).random()` and the C xorshift64*.

mod common;

use ds4_sampling::{NumpyPcg64, XorShift64Star};
use serde_json::Value;

fn hex_u64(v: &Value) -> u64 {
    u64::from_str_radix(v.as_str().expect("hex string"), 16).expect("hex")
}

#[test]
fn pcg64_random_matches_numpy_for_first_1000_values() {
    let data: Vec<Value> =
        serde_json::from_str(&common::read_fixture("pcg64_random.json")).unwrap();
    let seeds: Vec<u64> = data.iter().map(|d| d["seed"].as_u64().unwrap()).collect();
    assert_eq!(seeds, [0, 1, 42, (1 << 31) - 2, (1 << 40) + 7]);
    for d in &data {
        let seed = d["seed"].as_u64().unwrap();
        let bits = d["random_bits"].as_array().unwrap();
        assert_eq!(bits.len(), 1000);
        let mut rng = NumpyPcg64::from_seed(seed);
        for (i, b) in bits.iter().enumerate() {
            let got = rng.random();
            assert_eq!(got.to_bits(), hex_u64(b), "seed {seed}, value {i}: {got}");
        }
    }
}

#[test]
fn xorshift64star_matches_c_reference() {
    let data: Vec<Value> =
        serde_json::from_str(&common::read_fixture("xorshift64star.json")).unwrap();
    assert!(
        data.iter().any(|d| d["seed"].as_u64() == Some(0)),
        "zero-state guard covered"
    );
    for d in &data {
        let seed = d["seed"].as_u64().unwrap();
        let outs = d["next_u64"].as_array().unwrap();
        let unis = d["uniform_f32_bits"].as_array().unwrap();
        assert_eq!(outs.len(), 1000);
        let (mut a, mut b) = (XorShift64Star::new(seed), XorShift64Star::new(seed));
        for (i, (o, u)) in outs.iter().zip(unis).enumerate() {
            assert_eq!(a.next_u64(), hex_u64(o), "seed {seed}, output {i}");
            let got = b.uniform_f32();
            assert_eq!(
                u64::from(got.to_bits()),
                hex_u64(u),
                "seed {seed}, uniform {i}"
            );
            assert!((0.0..1.0).contains(&got));
        }
    }
}

#[test]
fn pcg64_seeding_differs_from_naive_word_order() {
    // Guards the high-word-first order: swapping the halves of the state
    // must give a different stream (so the parity test above is meaningful).
    let mut a = NumpyPcg64::from_seed(42);
    let mut b = NumpyPcg64::new(1, 2);
    assert_ne!(a.next_u64(), b.next_u64());
}
