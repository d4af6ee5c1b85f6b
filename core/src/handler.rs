//! A typed envelope and the shape of a handler: what the push consumer of `mmmq-client` and the
//! broker's in-process handlers (an application that embeds the broker) both call.

use std::fmt::Display;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use serde::de::DeserializeOwned;

use crate::{Envelope, Topic};

/// A message as a handler gets it: the envelope with typed content.
#[derive(Debug, Clone)]
pub struct Message<T> {
    /// The topic.
    pub topic: Topic,
    /// Its offset.
    pub offset: u64,
    /// Milliseconds since the Unix epoch, set by the broker at append.
    pub timestamp: u64,
    /// The producer's key.
    pub key: Option<String>,
    /// The content.
    pub content: T,
}

/// What an erased handler returns: `Ok` is an ACK, `Err(reason)` a NACK.
pub type HandlerFuture = Pin<Box<dyn Future<Output = Result<(), String>> + Send>>;

/// A handler with its content type erased: it takes an envelope and answers `Ok` (ACK) or
/// `Err(reason)` (NACK). What the push consumer keeps, and what the embedded broker registers.
pub type ErasedHandler = Arc<dyn Fn(Envelope) -> HandlerFuture + Send + Sync>;

/// Wraps a typed handler: the content is deserialized into `T` (a failure is an `Err` naming the
/// offset and topic), and the handler's error becomes the reason.
pub fn erase<T, F, Fut, E>(handler: F) -> ErasedHandler
where
    T: DeserializeOwned + Send + 'static,
    F: Fn(Message<T>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(), E>> + Send + 'static,
    E: Display + 'static,
{
    let handler = Arc::new(handler);
    Arc::new(move |env: Envelope| {
        let handler = handler.clone();
        Box::pin(async move {
            let content: T = serde_json::from_str(env.content.get()).map_err(|e| {
                format!(
                    "offset {} of {}: content does not fit the handler's type: {e}",
                    env.offset, env.topic
                )
            })?;
            let msg = Message {
                topic: env.topic,
                offset: env.offset,
                timestamp: env.timestamp,
                key: env.key,
                content,
            };
            handler(msg).await.map_err(|e| e.to_string())
        })
    })
}
