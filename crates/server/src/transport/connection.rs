//! One HTTP/1.1 connection served by hyper with the header timer on, a body
//! deadline stamped on each request, and a graceful close on shutdown.

use std::time::Instant;

use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpStream;
use tokio::sync::{OwnedSemaphorePermit, watch};
use tower::ServiceExt;

use super::limits::Limits;

/// When a request's body must have arrived (a request extension; the JSON
/// extractor stops reading there and answers 408).
#[derive(Debug, Clone, Copy)]
pub struct BodyDeadline(pub tokio::time::Instant);

pub(super) async fn serve(
    tcp: TcpStream,
    app: Router,
    limits: Limits,
    mut closing: watch::Receiver<bool>,
    // Held for the connection's life: the connection limit.
    _permit: OwnedSemaphorePermit,
) {
    let body_timeout = limits.body_timeout;
    let service = hyper::service::service_fn(move |mut request: hyper::Request<Incoming>| {
        let deadline = tokio::time::Instant::from_std(Instant::now() + body_timeout);
        request.extensions_mut().insert(BodyDeadline(deadline));
        app.clone().oneshot(request)
    });
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .keep_alive(true);
    let connection = builder.serve_connection(TokioIo::new(tcp), service);
    tokio::pin!(connection);
    tokio::select! {
        // A client error (timeout, reset, bad request line) ends only this
        // connection; hyper has already answered what it could.
        _ = connection.as_mut() => return,
        _ = closing.wait_for(|c| *c) => {}
    }
    // Shutdown: an idle connection closes now, a running request finishes
    // (the caller drops us when the grace period ends).
    connection.as_mut().graceful_shutdown();
    let _ = connection.await;
}
