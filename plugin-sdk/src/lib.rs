//! Write an mmmq message handler in Rust: one function and one macro line, built into a
//! WebAssembly component with `cargo build --target wasm32-wasip2`, deployed by pointing a
//! dispatcher's `plugin.path` at the `.wasm` file.
//!
//! ```
//! use mmmq_plugin_sdk::{Ack, Message};
//! use serde::Deserialize;
//!
//! #[derive(Deserialize)]
//! struct Order {
//!     id: u64,
//!     amount: f64,
//! }
//!
//! /// ACK orders with a positive amount; NACK the rest (they end up in `__dlq.<consumerId>`).
//! fn handle(msg: Message) -> Ack {
//!     match msg.json::<Order>() {
//!         Ok(order) if order.amount > 0.0 => {
//!             mmmq_plugin_sdk::info!("order {} for {:.2} on {}", order.id, order.amount, msg.topic);
//!             Ack::Ack
//!         }
//!         Ok(order) => {
//!             mmmq_plugin_sdk::warn!("order {} has amount {}", order.id, order.amount);
//!             Ack::Nack
//!         }
//!         Err(e) => {
//!             mmmq_plugin_sdk::error!("offset {}: not an order: {e}", msg.offset);
//!             Ack::Nack
//!         }
//!     }
//! }
//!
//! mmmq_plugin_sdk::export!(handle);
//!
//! // The handler is plain Rust, so it is tested natively:
//! assert_eq!(handle(Message::new("order.created", r#"{"id":1,"amount":9.5}"#)), Ack::Ack);
//! assert_eq!(handle(Message::new("order.created", r#"{"id":2,"amount":0}"#)), Ack::Nack);
//! assert_eq!(handle(Message::new("order.created", "[]")), Ack::Nack);
//! ```
//!
//! The crate of a plugin is a `cdylib` (for the component) and an `rlib` (for native tests):
//!
//! ```toml
//! [lib]
//! crate-type = ["cdylib", "rlib"]
//! ```
//!
//! A handler may also return `bool`, a `Result` (an `Err` is logged and NACKed) or a full
//! [`Verdict`] (`RetryAfter(ms)`, `DeadLetter(reason)`): anything that implements
//! [`IntoVerdict`]. [`Ack`] is [`Verdict`] under its first name, so `Ack::Ack` and `Ack::Nack` keep
//! working. [`config`] reads the dispatcher's `plugin.config`; [`emit`] produces to other topics
//! (exactly once, and only if the handler ACKs); [`http`] calls the origins the dispatcher allows.
//! The component implements the
//! `mmmq:plugin/handler@0.2.0` world (`wit/plugin.wit` in this crate, a copy of the repository's
//! `wit/0.2.0/plugin.wit`).
//!
//! # The sandbox
//! The component gets no filesystem, network or environment, and frozen clocks (use
//! [`Message::timestamp`]). Each call is cut off after the dispatcher's `timeoutMs` and memory is
//! capped at `maxMemoryBytes`; a trap, a panic, a timeout or running out of memory counts as a NACK.
//! Each (dispatcher, topic) has its own instance serving that topic's messages in a row, so state
//! kept in statics survives between calls and sees every message of the topic, but not a trap (the
//! broker starts a fresh instance), a reload, or a topic left idle while more than 64 others of
//! the dispatcher were busy (its instance is dropped).
#![deny(missing_docs)]

use serde::de::DeserializeOwned;

pub mod http;

#[cfg(feature = "embedded-sources")]
#[doc(hidden)]
pub mod sources;

#[doc(hidden)]
#[allow(clippy::too_many_arguments)] // generated code
pub mod __bindings {
    wit_bindgen::generate!({
        world: "handler",
        path: "wit",
        pub_export_macro: true,
        export_macro_name: "__export_handler",
        default_bindings_module: "mmmq_plugin_sdk::__bindings",
    });
}

use __bindings::mmmq::plugin::types as wit;

/// One message, as the broker hands it to the handler.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    /// The topic it was produced to.
    pub topic: String,
    /// The partition it is stored in.
    pub partition: u32,
    /// Its offset in the partition.
    pub offset: u64,
    /// Milliseconds since the Unix epoch, set by the broker at append.
    pub timestamp: u64,
    /// The producer's key.
    pub key: Option<String>,
    /// The producer's idempotency id.
    pub id: Option<String>,
    /// Which delivery this is: 1 the first time, one more per resend (after a NACK or a
    /// `RetryAfter`).
    pub attempt: u32,
    /// The content as JSON text, exactly as produced.
    pub content: String,
}

impl Message {
    /// A message for tests: partition 0, offset 0, timestamp 0, no key or id, first attempt.
    pub fn new(topic: impl Into<String>, content: impl Into<String>) -> Self {
        Self {
            topic: topic.into(),
            partition: 0,
            offset: 0,
            timestamp: 0,
            key: None,
            id: None,
            attempt: 1,
            content: content.into(),
        }
    }

    /// The same message as a later attempt (for tests).
    pub fn attempt(mut self, attempt: u32) -> Self {
        self.attempt = attempt;
        self
    }

    /// The same message with a key (for tests).
    pub fn with_key(mut self, key: impl Into<String>) -> Self {
        self.key = Some(key.into());
        self
    }

    /// The same message at an offset (for tests).
    pub fn at(mut self, offset: u64) -> Self {
        self.offset = offset;
        self
    }

    /// The content deserialized into your type.
    pub fn json<T: DeserializeOwned>(&self) -> Result<T, serde_json::Error> {
        serde_json::from_str(&self.content)
    }

    /// The content as an untyped JSON value.
    pub fn value(&self) -> Result<serde_json::Value, serde_json::Error> {
        self.json()
    }

    /// The value at a JSON pointer (RFC 6901, e.g. `/order/region`) in the content, or `None`
    /// when nothing is there; an error when the content is not JSON. Only the objects and arrays
    /// on the way are taken apart: a large field elsewhere is skipped, never copied, which makes
    /// this much cheaper than [`Message::value`] for routing and filtering.
    ///
    /// ```
    /// use mmmq_plugin_sdk::Message;
    /// use serde_json::json;
    ///
    /// let m = Message::new("t", r#"{"order":{"region":"eu","lines":[{"sku":7}]},"a/b":true}"#);
    /// assert_eq!(m.pointer("/order/region").unwrap(), Some(json!("eu")));
    /// assert_eq!(m.pointer("/order/lines/0/sku").unwrap(), Some(json!(7)));
    /// assert_eq!(m.pointer("/a~1b").unwrap(), Some(json!(true)));
    /// assert_eq!(m.pointer("/order/lines/1").unwrap(), None);
    /// assert_eq!(m.pointer("/order/region/x").unwrap(), None);
    /// assert_eq!(m.pointer("").unwrap().unwrap()["order"]["region"], "eu");
    /// assert!(Message::new("t", "{nope").pointer("/a").is_err());
    /// ```
    pub fn pointer(&self, pointer: &str) -> Result<Option<serde_json::Value>, serde_json::Error> {
        let mut at: &str = &self.content;
        if !pointer.is_empty() {
            let Some(tokens) = pointer.strip_prefix('/') else {
                return Ok(None);
            };
            for token in tokens.split('/') {
                let token = token.replace("~1", "/").replace("~0", "~");
                match pointer::child(at, &token)? {
                    Some(next) => at = next,
                    None => return Ok(None),
                }
            }
        }
        serde_json::from_str(at).map(Some)
    }
}

mod pointer;

impl From<wit::Message> for Message {
    fn from(m: wit::Message) -> Self {
        Self {
            topic: m.topic,
            partition: m.partition,
            offset: m.offset,
            timestamp: m.timestamp,
            key: m.key,
            id: m.id,
            attempt: m.attempt,
            content: m.content,
        }
    }
}

/// The answer to one message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Done: the broker moves on.
    Ack,
    /// Refused: the broker resends (up to the dispatcher's `maxNackRetries`), then dead-letters.
    Nack,
    /// Resend after this many milliseconds (one more attempt; not counted as a NACK).
    RetryAfter(u32),
    /// Straight to the dead-letter topic with this reason, no retries.
    DeadLetter(String),
}

/// [`Verdict`] under its first name: `Ack::Ack`, `Ack::Nack`.
pub type Ack = Verdict;

/// What a handler may return.
pub trait IntoVerdict {
    /// The answer.
    fn into_verdict(self) -> Verdict;
}

pub use IntoVerdict as IntoAck;

impl IntoVerdict for Verdict {
    fn into_verdict(self) -> Verdict {
        self
    }
}

impl IntoVerdict for bool {
    fn into_verdict(self) -> Verdict {
        if self { Verdict::Ack } else { Verdict::Nack }
    }
}

impl<T, E: std::fmt::Display> IntoVerdict for Result<T, E> {
    fn into_verdict(self) -> Verdict {
        match self {
            Ok(_) => Verdict::Ack,
            Err(e) => {
                __private::log(Level::Warn, format!("handler failed: {e}"));
                Verdict::Nack
            }
        }
    }
}

/// A value of the dispatcher's `plugin.config` (`dispatchers.json`). In native tests, the values
/// set with [`testing::set_config`].
pub fn config(key: &str) -> Option<String> {
    __private::config(key)
}

/// Produces a message to another topic, as part of handling this one (docs/plugins.md,
/// "WebAssembly handlers"). It is appended only if the handler answers [`Verdict::Ack`], before the broker
/// moves past the message, and exactly once, even across a crash and a re-run of the message.
/// A keyed message goes to its key's partition, as a producer's would.
///
/// Refused, with the reason, for a `__` topic, a name that is not a topic name, content that is
/// not JSON, more than 1,000 emits in one call or more than 32 × the broker's message limit in
/// all. In native tests the emits are kept for [`testing::take_emits`].
pub fn emit(topic: &str, key: Option<&str>, content: &str) -> Result<(), EmitError> {
    __private::emit(topic, key, content).map_err(EmitError)
}

/// [`emit`] with content serialized from a value.
pub fn emit_json<T: serde::Serialize + ?Sized>(
    topic: &str,
    key: Option<&str>,
    value: &T,
) -> Result<(), EmitError> {
    let content = serde_json::to_string(value).map_err(|e| EmitError(e.to_string()))?;
    emit(topic, key, &content)
}

/// Why the broker refused an emit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EmitError(pub String);

impl std::fmt::Display for EmitError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "emit refused: {}", self.0)
    }
}

impl std::error::Error for EmitError {}

/// One message a handler emitted (native tests: [`testing::take_emits`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Emitted {
    /// Where it goes.
    pub topic: String,
    /// Its key.
    pub key: Option<String>,
    /// Its content as JSON text.
    pub content: String,
}

/// Helpers for native tests of a handler.
pub mod testing {
    use super::Emitted;

    /// Sets what [`crate::config`] answers for `key` in this thread (native tests only).
    pub fn set_config(key: &str, value: &str) {
        super::__private::TEST_CONFIG.with(|c| {
            c.borrow_mut().insert(key.to_owned(), value.to_owned());
        });
    }

    /// Answers the handler's HTTP requests in this thread with `responder` (native tests only;
    /// without one, every request fails with "no HTTP in native tests").
    pub fn on_http(
        responder: impl Fn(
            &crate::http::Request,
        ) -> Result<crate::http::Response, crate::http::HttpError>
        + 'static,
    ) {
        super::__private::TEST_HTTP.with(|h| *h.borrow_mut() = Some(Box::new(responder)));
    }

    /// The HTTP requests the handler sent in this thread since the last call, in order (native
    /// tests only).
    pub fn take_requests() -> Vec<crate::http::Request> {
        super::__private::TEST_REQUESTS.with(|r| std::mem::take(&mut *r.borrow_mut()))
    }

    /// What the handler emitted in this thread since the last call, in order (native tests only).
    /// Natively every emit is kept, whatever the verdict; in the broker only an `Ack`'s are.
    pub fn take_emits() -> Vec<Emitted> {
        super::__private::TEST_EMITS.with(|e| std::mem::take(&mut *e.borrow_mut()))
    }
}

/// Log levels of the host's log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    /// Very detailed.
    Trace,
    /// Detailed.
    Debug,
    /// Normal.
    Info,
    /// Something looks wrong.
    Warn,
    /// Something is wrong.
    Error,
}

/// Exports `handler` (a `fn(Message) -> impl IntoVerdict`) as the component's `handle`.
#[macro_export]
macro_rules! export {
    ($handler:path) => {
        #[doc(hidden)]
        struct __MmmqHandler;
        impl $crate::__bindings::Guest for __MmmqHandler {
            fn handle(
                message: $crate::__bindings::mmmq::plugin::types::Message,
            ) -> $crate::__bindings::mmmq::plugin::types::Verdict {
                $crate::__private::call($handler, message)
            }
        }
        $crate::__bindings::__export_handler!(__MmmqHandler with_types_in $crate::__bindings);
    };
}

/// Logs at a level (`format!` syntax). Lines land in the broker's log, tagged with the consumerId.
#[macro_export]
macro_rules! log {
    ($level:expr, $($arg:tt)+) => {
        $crate::__private::log($level, ::std::format!($($arg)+))
    };
}

/// Logs at trace level.
#[macro_export]
macro_rules! trace { ($($arg:tt)+) => { $crate::log!($crate::Level::Trace, $($arg)+) }; }
/// Logs at debug level.
#[macro_export]
macro_rules! debug { ($($arg:tt)+) => { $crate::log!($crate::Level::Debug, $($arg)+) }; }
/// Logs at info level.
#[macro_export]
macro_rules! info { ($($arg:tt)+) => { $crate::log!($crate::Level::Info, $($arg)+) }; }
/// Logs at warn level.
#[macro_export]
macro_rules! warn { ($($arg:tt)+) => { $crate::log!($crate::Level::Warn, $($arg)+) }; }
/// Logs at error level.
#[macro_export]
macro_rules! error { ($($arg:tt)+) => { $crate::log!($crate::Level::Error, $($arg)+) }; }

#[doc(hidden)]
pub mod __private {
    use super::*;

    pub fn call<R: IntoVerdict>(handler: fn(Message) -> R, message: wit::Message) -> wit::Verdict {
        match handler(message.into()).into_verdict() {
            Verdict::Ack => wit::Verdict::Ack,
            Verdict::Nack => wit::Verdict::Nack,
            Verdict::RetryAfter(ms) => wit::Verdict::RetryAfter(ms),
            Verdict::DeadLetter(reason) => wit::Verdict::DeadLetter(reason),
        }
    }

    thread_local! {
        /// `config` in native tests.
        pub static TEST_CONFIG: std::cell::RefCell<std::collections::HashMap<String, String>> =
            std::cell::RefCell::new(std::collections::HashMap::new());
        /// `emit` in native tests.
        pub static TEST_EMITS: std::cell::RefCell<Vec<Emitted>> =
            const { std::cell::RefCell::new(Vec::new()) };
        /// HTTP in native tests: the responder and the requests sent.
        pub static TEST_HTTP: std::cell::RefCell<Option<Box<Responder>>> =
            const { std::cell::RefCell::new(None) };
        pub static TEST_REQUESTS: std::cell::RefCell<Vec<crate::http::Request>> =
            const { std::cell::RefCell::new(Vec::new()) };
    }

    pub type Responder =
        dyn Fn(&crate::http::Request) -> Result<crate::http::Response, crate::http::HttpError>;

    #[cfg(not(target_arch = "wasm32"))]
    pub fn native_http(
        request: crate::http::Request,
    ) -> Result<crate::http::Response, crate::http::HttpError> {
        let answer = TEST_HTTP.with(|h| match &*h.borrow() {
            Some(respond) => respond(&request),
            None => Err(crate::http::HttpError(
                "no HTTP in native tests: answer requests with testing::on_http".into(),
            )),
        });
        TEST_REQUESTS.with(|r| r.borrow_mut().push(request));
        answer
    }

    #[cfg(target_arch = "wasm32")]
    pub fn emit(topic: &str, key: Option<&str>, content: &str) -> Result<(), String> {
        __bindings::mmmq::plugin::host::emit(topic, key, content)
    }

    /// Natively the broker's first checks are mirrored (a `__` topic, content that is not JSON),
    /// so a test sees the refusals a handler must deal with.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn emit(topic: &str, key: Option<&str>, content: &str) -> Result<(), String> {
        if topic.starts_with("__") {
            return Err(format!(
                "topic {topic:?} is internal; plugins cannot emit to it"
            ));
        }
        if topic.is_empty() {
            return Err("the topic name is empty".into());
        }
        serde_json::from_str::<serde::de::IgnoredAny>(content)
            .map_err(|e| format!("content is not JSON: {e}"))?;
        TEST_EMITS.with(|e| {
            e.borrow_mut().push(Emitted {
                topic: topic.to_owned(),
                key: key.map(str::to_owned),
                content: content.to_owned(),
            })
        });
        Ok(())
    }

    /// An instance's config never changes (a new `plugin.config` means new instances), so each
    /// key is asked of the host once.
    #[cfg(target_arch = "wasm32")]
    pub fn config(key: &str) -> Option<String> {
        thread_local! {
            static CACHE: std::cell::RefCell<std::collections::HashMap<String, Option<String>>> =
                std::cell::RefCell::default();
        }
        CACHE.with(|c| {
            if let Some(value) = c.borrow().get(key) {
                return value.clone();
            }
            let value = __bindings::mmmq::plugin::host::get_config(key);
            c.borrow_mut().insert(key.to_owned(), value.clone());
            value
        })
    }

    #[cfg(not(target_arch = "wasm32"))]
    pub fn config(key: &str) -> Option<String> {
        TEST_CONFIG.with(|c| c.borrow().get(key).cloned())
    }

    #[cfg(target_arch = "wasm32")]
    pub fn log(level: Level, line: String) {
        use __bindings::mmmq::plugin::log as host;
        let level = match level {
            Level::Trace => host::Level::Trace,
            Level::Debug => host::Level::Debug,
            Level::Info => host::Level::Info,
            Level::Warn => host::Level::Warn,
            Level::Error => host::Level::Error,
        };
        host::log(level, &line);
    }

    /// Natively (unit tests) there is no host: lines go to stderr.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn log(level: Level, line: String) {
        eprintln!("[{level:?}] {line}");
    }
}
