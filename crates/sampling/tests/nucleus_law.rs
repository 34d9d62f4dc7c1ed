//! Nucleus-law parity with the reference (NumPy `Generator.choice` over the
//! spec-written Python law). Separate from the ds4 test: family isolation.

mod common;

use ds4_sampling::Law;

#[test]
fn nucleus_fixture_tokens_and_draw_counts_match_reference() {
    let stats = common::check_law_fixture(Law::Nucleus);
    // The fixture must actually exercise both outcomes.
    assert!(stats.cases >= 2000, "{stats:?}");
    assert!(stats.errors > 0 && stats.tokens > 5000, "{stats:?}");
    assert_eq!(stats.fallbacks, 0, "the nucleus law never falls back");
}
