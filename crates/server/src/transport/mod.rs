//! The listening socket and its connections: what a client may hold and for
//! how long, and how the server stops.
//!
//! `axum::serve` waits for every open connection on shutdown and never times
//! out a client that sent half a request, so one slow or stalled client kept
//! the process alive forever. This loop serves each connection with hyper
//! directly and bounds everything a client controls:
//!
//! - headers: hyper's header timer, which also starts when a kept-alive
//!   connection waits for its next request, so it is the idle limit too;
//! - bodies: a deadline per request ([`BodyDeadline`], read by the JSON
//!   extractor; past it the request gets 408);
//! - connections: at most [`Limits::max_connections`] open at once; more are
//!   closed as soon as they are accepted (counted in `/metrics`);
//! - shutdown: no new connections, idle ones closed, running requests get
//!   [`Limits::shutdown_grace`]; then every connection is dropped, which
//!   cancels its turn at the engine's next chunk or token.

mod connection;
mod limits;
pub mod signal;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, watch};
use tokio::task::JoinSet;

pub use connection::BodyDeadline;
pub use limits::Limits;

use crate::metrics::Metrics;

/// How the connections ended once the server was told to stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Drained {
    /// Every connection finished within the grace period.
    Clean,
    /// The grace period ran out; this many connections were dropped.
    Dropped(usize),
}

/// Accept and serve connections until `stop` resolves; then drain them
/// within the grace period and drop what is left.
pub async fn run(
    listener: TcpListener,
    app: Router,
    limits: Limits,
    metrics: Arc<Metrics>,
    stop: impl Future<Output = ()>,
) -> Drained {
    let permits = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let (closing, close_rx) = watch::channel(false);
    let mut connections = JoinSet::new();
    tokio::pin!(stop);
    loop {
        tokio::select! {
            _ = &mut stop => break,
            accepted = listener.accept() => {
                let (tcp, _peer) = match accepted {
                    Ok(a) => a,
                    Err(e) => {
                        // Out of file descriptors and the like: the error is
                        // the listener's, not the client's; back off briefly
                        // instead of spinning on it.
                        tracing::warn!("accept failed: {e}");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let Ok(permit) = permits.clone().try_acquire_owned() else {
                    metrics.connection_refused();
                    drop(tcp);
                    continue;
                };
                let _ = tcp.set_nodelay(true);
                connections.spawn(connection::serve(tcp, app.clone(), limits, close_rx.clone(), permit));
            }
            // Reap finished connections so the set does not grow.
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
    drop(listener);
    let _ = closing.send(true);
    let deadline = tokio::time::sleep(limits.shutdown_grace);
    tokio::pin!(deadline);
    loop {
        tokio::select! {
            _ = &mut deadline => break,
            next = connections.join_next() => if next.is_none() { return Drained::Clean },
        }
    }
    let left = connections.len();
    // Dropping a connection drops its handler and its SSE body, so the
    // turn's event receiver goes and the worker cancels the turn.
    connections.shutdown().await;
    Drained::Dropped(left)
}
