//! ds4-law parity with the C reference (tools/oracle/sampling/ds4_ref.c).
//! Separate from the nucleus test: family isolation.

mod common;

use ds4_sampling::Law;

#[test]
fn ds4_fixture_tokens_and_draw_counts_match_reference() {
    let stats = common::check_law_fixture(Law::Ds4);
    assert!(stats.cases >= 2000, "{stats:?}");
    assert!(stats.tokens > 5000, "{stats:?}");
    // The ds4 law never errors on a row; its fallback is flagged instead.
    assert_eq!(stats.errors, 0, "{stats:?}");
    assert!(
        stats.fallbacks > 0,
        "fixture must cover the argmax fallback: {stats:?}"
    );
}
