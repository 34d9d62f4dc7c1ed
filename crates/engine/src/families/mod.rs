//! Model families. Each lives in its own module and touches shared code only
//! through the [`crate::Model`] contract and its [`FamilyDescriptor`].

pub mod llama;

/// What the rest of the system may know about a family.
#[derive(Debug)]
pub struct FamilyDescriptor {
    pub name: &'static str,
    /// `general.architecture` (GGUF) or `model_type` (config.json) values.
    pub model_types: &'static [&'static str],
}
