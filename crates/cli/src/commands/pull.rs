//! `ds4server pull`: fetch the default model into the user cache.

pub fn pull() -> anyhow::Result<()> {
    let path = crate::model_source::pull_with_progress()?;
    println!("{}", path.display());
    Ok(())
}
