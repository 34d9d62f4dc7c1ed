//! Server-sent events: a writer task pushes events into a channel that the
//! response body drains. When the client disconnects, axum drops the body;
//! the writer sees it at once ([`SseSender::gone`]) or at its next send,
//! and returns, dropping the turn's stream, which cancels the turn
//! (`admission::Ticket`).

use std::convert::Infallible;
use std::future::Future;
use std::time::Duration;

use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use tokio::sync::mpsc;

use crate::error::ApiError;

/// The writer's end of a stream.
pub struct SseSender {
    tx: mpsc::Sender<Event>,
}

impl SseSender {
    /// Send `data` as JSON, under `event` when given. False: client gone.
    pub async fn json(&self, event: Option<&str>, data: &impl Serialize) -> bool {
        let payload = match serde_json::to_string(data) {
            Ok(p) => p,
            Err(_) => return false,
        };
        let mut e = Event::default().data(payload);
        if let Some(name) = event {
            e = e.event(name);
        }
        self.tx.send(e).await.is_ok()
    }

    /// Resolves when the response body is gone (the client left).
    pub fn gone(&self) -> impl Future<Output = ()> + Send + 'static + use<> {
        let tx = self.tx.clone();
        async move { tx.closed().await }
    }

    /// OpenAI's end-of-stream marker.
    pub async fn done(&self) -> bool {
        self.tx.send(Event::default().data("[DONE]")).await.is_ok()
    }

    /// An error after the headers went out: an `error` event in the API's
    /// error shape (clients raise it as an API error).
    pub async fn error(&self, error: &ApiError) -> bool {
        self.json(Some("error"), &error.body()).await
    }
}

/// Start `writer` on its own task and answer with the event stream. Keep-
/// alive comments go out whenever nothing else did for `keep_alive` (a long
/// prefill or a long wait in the queue).
pub fn respond<F, Fut>(keep_alive: Duration, writer: F) -> Response
where
    F: FnOnce(SseSender) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let (tx, rx) = mpsc::channel::<Event>(64);
    tokio::spawn(writer(SseSender { tx }));
    let stream = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|e| (Ok::<_, Infallible>(e), rx))
    });
    Sse::new(stream)
        .keep_alive(KeepAlive::new().interval(keep_alive).text("keep-alive"))
        .into_response()
}
