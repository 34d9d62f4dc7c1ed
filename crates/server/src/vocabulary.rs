//! The vocabulary structured outputs compile against (`constraints`), kept
//! in the shared state (`state`) and built on first use. Its own module so
//! that the state names it without depending on the request layer.

use std::sync::{Arc, OnceLock};

use ds4_constraint::{ConstraintError, Vocabulary};
use ds4_text::Tokenizer;

/// The model's vocabulary for constraints, built on first use (the trie
/// over every token takes a moment on a large vocabulary; requests without
/// a constraint never pay it).
#[derive(Default)]
pub struct LazyVocabulary(OnceLock<Result<Arc<Vocabulary>, ConstraintError>>);

impl LazyVocabulary {
    pub fn get(&self, tokenizer: &Arc<Tokenizer>) -> Result<Arc<Vocabulary>, ConstraintError> {
        self.0
            .get_or_init(|| {
                Vocabulary::new(tokenizer.clone(), tokenizer.stop_token_ids()).map(Arc::new)
            })
            .clone()
    }
}
