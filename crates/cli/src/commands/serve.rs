//! `ds4server serve`: load the model, start the engine worker and serve the
//! HTTP API until Ctrl+C or SIGTERM (then the live session is saved when
//! checkpoints are on).

use std::net::SocketAddr;
use std::path::Path;

use ds4_server::ServerConfig;

use crate::args::ServeArgs;
use crate::commands::sessions::CacheSettings;

pub fn serve(args: ServeArgs) -> anyhow::Result<()> {
    let path = crate::model_source::resolve(args.model.model.as_deref())?;
    let loaded = crate::model_source::load(Some(&path), &args.model)?;
    let mut config = ServerConfig::new(
        SocketAddr::new(args.host, args.port),
        args.model_id.unwrap_or_else(|| model_id(&path)),
    );
    config.model_aliases = args.model_aliases;
    config.strict_model_names = args.strict_model_names;
    config.default_max_tokens = (args.default_max_tokens > 0).then_some(args.default_max_tokens);
    config.ctx = args.ctx;
    if let Some(n) = args.max_queue {
        config.max_queue = n;
    }
    config.max_queue_tokens = args.max_queue_tokens;
    config.max_batch = args.max_batch as usize;
    config.max_batch_tokens = args.max_batch_tokens as usize;
    config.images = ds4_server::ImageLimits {
        max_images: args.max_images,
        max_image_bytes: args.max_image_bytes,
    };
    config.max_image_pixels = args.max_image_pixels;
    // A vision-language checkpoint's tower is read from its directory.
    config.model_dir = Some(path.clone());
    config.api_key = args.api_key;
    config.cors = args.cors;
    config.allowed_hosts = args.allowed_host;
    config.limits = ds4_server::Limits {
        header_timeout: args.header_timeout,
        body_timeout: args.body_timeout,
        max_connections: args.max_connections,
        shutdown_grace: args.shutdown_grace,
    };
    config.seed = args.seed;
    config.temperature = args.temperature;
    if args.force_sampling && args.temperature.is_none() && args.seed.is_none() {
        anyhow::bail!("--force-sampling needs --temperature or --seed (the values to force)");
    }
    config.force_sampling = args.force_sampling;
    config.body_limit = args.body_limit;
    // No `--mtp-depth`: the model's own default where it drafts by default
    // (the default model's head on the CPU's fast set), else the family's —
    // but not with several lanes: there the other sessions' rows fill the
    // forwards that drafts would (an MTP turn's verify windows join the
    // batches, but its draft steps run alone between them), and the choice
    // must not depend on the load, or a sampled request's tokens would.
    let depths = args
        .mtp_depth
        .map(|d| d.resolve(&loaded.model))
        .or_else(|| {
            (args.max_batch <= 1)
                .then(|| loaded.model.mtp_default_depth())
                .flatten()
        });
    config.mtp_depth = depths.map(|d| d.greedy);
    config.mtp_depth_sampled = depths.map(|d| d.sampled);
    let cache = CacheSettings::from_args(&args.checkpoints, &path)?;
    config.bank_budget = cache.bank_budget;
    config.boundary_every = cache.boundary_every;
    config.checkpoints = cache.checkpoints;
    let state = ds4_server::build_state(config, loaded.model, loaded.tokenizer)?;
    if let Some(asked) = args.ctx
        && asked > state.ctx
    {
        eprintln!(
            "warning: --ctx {asked} exceeds what the model supports ({} tokens); serving a \
             context of {} tokens",
            state.ctx, state.ctx
        );
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(ds4_server::serve(state))?;
    // A tokenization still running on a blocking thread for a dropped
    // connection must not hold the exit (it stops at the context anyway).
    runtime.shutdown_timeout(std::time::Duration::from_millis(100));
    Ok(())
}

/// `SmolLM2-135M-Instruct.Q4_1.gguf` → `SmolLM2-135M-Instruct.Q4_1`.
fn model_id(path: &Path) -> String {
    let name = path
        .file_name()
        .map_or_else(|| "model".to_string(), |n| n.to_string_lossy().into_owned());
    name.strip_suffix(".gguf")
        .map_or(name.clone(), str::to_string)
}
