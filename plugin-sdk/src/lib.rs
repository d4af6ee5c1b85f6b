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
//! A handler may also return `bool` or a `Result` (an `Err` is logged and NACKed): anything that
//! implements [`IntoAck`].
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

#[doc(hidden)]
#[allow(clippy::too_many_arguments)] // generated code
pub mod __bindings {
    wit_bindgen::generate!({
        world: "handler",
        path: "../wit",
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
    /// Its offset in the topic.
    pub offset: u64,
    /// Milliseconds since the Unix epoch, set by the broker at append.
    pub timestamp: u64,
    /// The producer's key.
    pub key: Option<String>,
    /// The content as JSON text, exactly as produced.
    pub content: String,
}

impl Message {
    /// A message for tests: offset 0, timestamp 0, no key.
    pub fn new(topic: impl Into<String>, content: impl Into<String>) -> Self {
        Self {
            topic: topic.into(),
            offset: 0,
            timestamp: 0,
            key: None,
            content: content.into(),
        }
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
}

impl From<wit::Message> for Message {
    fn from(m: wit::Message) -> Self {
        Self {
            topic: m.topic,
            offset: m.offset,
            timestamp: m.timestamp,
            key: m.key,
            content: m.content,
        }
    }
}

/// The answer to one message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ack {
    /// Done: the broker moves on.
    Ack,
    /// Refused: the broker resends, then dead-letters.
    Nack,
}

/// What a handler may return.
pub trait IntoAck {
    /// The answer.
    fn into_ack(self) -> Ack;
}

impl IntoAck for Ack {
    fn into_ack(self) -> Ack {
        self
    }
}

impl IntoAck for bool {
    fn into_ack(self) -> Ack {
        if self { Ack::Ack } else { Ack::Nack }
    }
}

impl<T, E: std::fmt::Display> IntoAck for Result<T, E> {
    fn into_ack(self) -> Ack {
        match self {
            Ok(_) => Ack::Ack,
            Err(e) => {
                __private::log(Level::Warn, format!("handler failed: {e}"));
                Ack::Nack
            }
        }
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

/// Exports `handler` (a `fn(Message) -> impl IntoAck`) as the component's `handle`.
#[macro_export]
macro_rules! export {
    ($handler:path) => {
        #[doc(hidden)]
        struct __MmmqHandler;
        impl $crate::__bindings::Guest for __MmmqHandler {
            fn handle(
                message: $crate::__bindings::mmmq::plugin::types::Message,
            ) -> $crate::__bindings::mmmq::plugin::types::Ack {
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

    pub fn call<R: IntoAck>(handler: fn(Message) -> R, message: wit::Message) -> wit::Ack {
        match handler(message.into()).into_ack() {
            Ack::Ack => wit::Ack::Ack,
            Ack::Nack => wit::Ack::Nack,
        }
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
