//! What a client may hold: the connection's timers, the connection limit
//! and the shutdown grace. Its own file so that `connection` reads it
//! without naming its parent module.

use std::time::Duration;

/// What a client may hold (from `serve`'s flags).
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Time for a request's headers, counted from when the connection starts
    /// waiting for them (an idle kept-alive connection is closed after it).
    pub header_timeout: Duration,
    /// Time for a request's body, counted from its headers.
    pub body_timeout: Duration,
    /// Connections open at once; more are closed on accept.
    pub max_connections: usize,
    /// How long running requests may go on after a shutdown signal.
    pub shutdown_grace: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            header_timeout: Duration::from_secs(10),
            body_timeout: Duration::from_secs(30),
            max_connections: 256,
            shutdown_grace: Duration::from_secs(5),
        }
    }
}
