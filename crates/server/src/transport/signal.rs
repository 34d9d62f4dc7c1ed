//! Shutdown signals: Ctrl+C, or SIGTERM on Unix (what `kill` and service
//! managers send). The first one starts a graceful shutdown; a second one
//! means the operator does not want to wait.

/// Resolves on the next Ctrl+C or SIGTERM.
pub async fn next() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = ctrl_c => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => ctrl_c.await,
        }
    }
    #[cfg(not(unix))]
    ctrl_c.await;
}
