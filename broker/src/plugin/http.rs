//! Outbound HTTP for plugins (docs/plugins.md, "WebAssembly handlers"): the standard `wasi:http` outgoing
//! handler, limited to the dispatcher's `plugin.allowedHosts` and to the time left in the call.
//!
//! A request to any other origin is refused with `HTTP-request-denied` (and a line in the
//! plugin's log saying why); without `allowedHosts` every request is. So is a URL with a user
//! (`user@host`): the origin check reads the host after the `@`, while the connection would be
//! made to the whole authority. A request, its response and the response's body must all arrive
//! before the call's `timeoutMs` runs out: the guest's wait for them ends there as the call's
//! timeout (`waits`), and the connection, the request and its body are given up at the same
//! deadline here, so nothing of the request outlives the call.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body::{Body, Frame};
use http_body_util::BodyExt;
use wasmtime_wasi_http::{Error as HttpError, RequestOptions, WasiBody, WasiHttpHooks};

use super::guest_log::{GuestLevel, GuestLog};
use crate::config::AllowedOrigin;

/// The `wasi:http` hooks of one instance.
pub(super) struct HttpHooks {
    allowed: Arc<Vec<AllowedOrigin>>,
    /// When the call in progress must end.
    pub(super) deadline: Instant,
    log: GuestLog,
}

impl HttpHooks {
    pub(super) fn new(allowed: Arc<Vec<AllowedOrigin>>, log: GuestLog) -> Self {
        Self {
            allowed,
            deadline: Instant::now(),
            log,
        }
    }
}

type Sent = Box<
    dyn Future<
            Output = Result<
                (
                    http::Response<WasiBody>,
                    Box<dyn Future<Output = Result<(), HttpError>> + Send>,
                ),
                HttpError,
            >,
        > + Send,
>;

impl WasiHttpHooks for HttpHooks {
    fn send_request(
        &mut self,
        request: http::Request<WasiBody>,
        options: Option<RequestOptions>,
        _fut: Box<dyn Future<Output = Result<(), HttpError>> + Send>,
    ) -> Sent {
        let uri = request.uri().clone();
        let user = uri.authority().is_some_and(|a| a.as_str().contains('@'));
        if user || !self.allowed.iter().any(|o| o.allows(&uri)) {
            let why = if user {
                "the URL carries a user (`user@` before the host), which plugin.allowedHosts never allows"
                    .to_owned()
            } else if self.allowed.is_empty() {
                "this plugin has no network (no plugin.allowedHosts)".to_owned()
            } else {
                let list: Vec<String> = self.allowed.iter().map(ToString::to_string).collect();
                format!("not in plugin.allowedHosts ({})", list.join(", "))
            };
            self.log.emit(
                GuestLevel::Warn,
                "http",
                &format!("request to {} refused: {why}", origin_of(&uri)),
            );
            return Box::new(async { Err(HttpError::HttpRequestDenied) });
        }
        let deadline = self.deadline;
        let left = deadline.saturating_duration_since(Instant::now());
        let cap = |d: Option<Duration>| Some(d.map_or(left, |d| d.min(left)));
        let options = RequestOptions {
            connect_timeout: cap(options.and_then(|o| o.connect_timeout)),
            first_byte_timeout: cap(options.and_then(|o| o.first_byte_timeout)),
            between_bytes_timeout: cap(options.and_then(|o| o.between_bytes_timeout)),
        };
        Box::new(async move {
            let sent = tokio::time::timeout(
                left,
                wasmtime_wasi_http::default_send_request(request, Some(options)),
            )
            .await;
            match sent {
                Err(_) => Err(HttpError::ConnectionTimeout),
                Ok(Err(e)) => Err(e),
                Ok(Ok((response, io))) => Ok((
                    response
                        .map(|body| Deadline::new(body.boxed_unsync(), deadline).boxed_unsync()),
                    Box::new(io) as Box<dyn Future<Output = _> + Send>,
                )),
            }
        })
    }
}

/// `scheme://host[:port]`, without a user and whatever follows it (a password).
fn origin_of(uri: &http::Uri) -> String {
    let host = uri.authority().map_or("?".to_owned(), |a| match a.port() {
        Some(port) => format!("{}:{port}", a.host()),
        None => a.host().to_owned(),
    });
    format!("{}://{host}", uri.scheme_str().unwrap_or("?"))
}

/// A response body that fails once the call's deadline has passed, so a server that trickles
/// its answer cannot hold a call past `timeoutMs`.
struct Deadline<B> {
    body: B,
    sleep: Pin<Box<tokio::time::Sleep>>,
}

impl<B> Deadline<B> {
    fn new(body: B, deadline: Instant) -> Self {
        Self {
            body,
            sleep: Box::pin(tokio::time::sleep_until(deadline.into())),
        }
    }
}

impl<B> Body for Deadline<B>
where
    B: Body<Data = Bytes, Error = HttpError> + Unpin,
{
    type Data = Bytes;
    type Error = HttpError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, HttpError>>> {
        if let Poll::Ready(frame) = Pin::new(&mut self.body).poll_frame(cx) {
            return Poll::Ready(frame);
        }
        match self.sleep.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Some(Err(HttpError::ConnectionReadTimeout))),
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}
