//! Every registered engine family has a text profile (reasoning markers and
//! tool-call format): a family added to the engine's registry without one
//! fails here instead of silently serving plain text.

use ds4_engine::families::FAMILIES;
use ds4_text::TextProfile;

#[test]
fn every_registered_family_has_a_text_profile() {
    assert!(!FAMILIES.is_empty());
    for f in FAMILIES {
        let name = f.descriptor.name;
        assert_eq!(
            TextProfile::for_family(name).family,
            name,
            "family `{name}` has no TextProfile (crates/text/src/profile.rs)"
        );
    }
}
