//! One module per subcommand.

pub mod bench;
#[cfg(feature = "cuda")]
pub mod bench_host_gaps;
pub mod bench_mtp;
pub mod bench_nll;
pub mod bench_streams;
pub mod bench_synthetic;
pub mod chat;
pub mod debug;
pub mod imatrix;
pub mod imatrix_collect;
pub mod imatrix_names;
pub mod imatrix_run;
pub mod imatrix_write;
pub mod inspect;
pub mod pull;
pub mod quantize;
pub mod quantize_layout;
pub mod quantize_recipes;
pub mod quantize_report;
pub mod quantize_source;
pub mod quantize_tokenizer;
pub mod quantize_validate;
pub mod run;
pub mod serve;
pub mod sessions;
