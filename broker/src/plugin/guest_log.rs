//! Where a guest's words go: the `log` import and its stdout/stderr both end up in `tracing`,
//! tagged with the dispatcher's consumerId, through a token bucket so that a guest that logs in a
//! loop cannot flood the broker's log (what is dropped is counted and reported). Lines that pass
//! the bucket also go, as `{"level","message","topic","partition","offset","version"}`, to a sink
//! the broker appends to the topic `__logs.<consumerId>` (docs/plugins.md, "WebAssembly handlers").
//!
//! A line is the guest's text, so in the broker's log its control characters are escaped
//! ([`escape_controls`]): a newline in it would otherwise start what reads as a line of the
//! broker's own, and an ANSI sequence would recolour or rewrite the operator's terminal. The topic
//! keeps the exact text: it stores JSON, which escapes it.

use std::borrow::Cow;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use parking_lot::Mutex;
use wasmtime_wasi::p2::{OutputStream, Pollable, StreamError};

/// Lines per second a guest may log on average.
const RATE: f64 = 200.0;
/// Lines a guest may log in a burst.
const BURST: f64 = 1000.0;
/// Longest line kept; the rest is cut.
const MAX_LINE: usize = 4096;

/// Guest log levels, as the WIT spells them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GuestLevel {
    /// trace
    Trace,
    /// debug
    Debug,
    /// info
    Info,
    /// warn
    Warn,
    /// error
    Error,
}

/// A line for `__logs.<consumerId>`.
#[derive(Debug)]
pub struct LogRecord {
    /// The dispatcher whose plugin logged it.
    pub consumer_id: Arc<str>,
    /// `{"level","message","topic","partition","offset","version"}`.
    pub json: String,
}

/// Where [`LogRecord`]s go; full means dropped (the broker's log has the line anyway).
pub type LogSink = tokio::sync::mpsc::Sender<LogRecord>;

/// The message an instance is handling, for its log lines.
#[derive(Debug, Clone)]
pub struct LineContext {
    /// Topic.
    pub topic: String,
    /// Partition.
    pub partition: u32,
    /// Offset.
    pub offset: u64,
    /// The plugin version handling it.
    pub version: String,
}

struct Bucket {
    tokens: f64,
    refilled: Instant,
    dropped: u64,
}

/// The log of one plugin dispatcher (its bucket shared by its instances; each instance has its
/// own copy, [`GuestLog::for_instance`], that knows which message it is handling).
#[derive(Clone)]
pub struct GuestLog {
    consumer_id: Arc<str>,
    bucket: Arc<Mutex<Bucket>>,
    sink: Option<LogSink>,
    context: Arc<Mutex<Option<LineContext>>>,
}

impl GuestLog {
    /// A log for `consumer_id`; lines also go to `sink` when there is one.
    pub fn new(consumer_id: &str, sink: Option<LogSink>) -> Self {
        Self {
            consumer_id: consumer_id.into(),
            bucket: Arc::new(Mutex::new(Bucket {
                tokens: BURST,
                refilled: Instant::now(),
                dropped: 0,
            })),
            sink,
            context: Arc::default(),
        }
    }

    /// The same log with a message context of its own, for one instance.
    pub fn for_instance(&self) -> Self {
        Self {
            context: Arc::default(),
            ..self.clone()
        }
    }

    /// The message being handled (`None` between calls).
    pub fn set_context(&self, context: Option<LineContext>) {
        *self.context.lock() = context;
    }

    /// Emits one guest line, unless the guest is over its budget.
    pub fn emit(&self, level: GuestLevel, source: &'static str, line: &str) {
        let dropped = {
            let mut b = self.bucket.lock();
            let now = Instant::now();
            b.tokens = (b.tokens + now.duration_since(b.refilled).as_secs_f64() * RATE).min(BURST);
            b.refilled = now;
            if b.tokens < 1.0 {
                b.dropped += 1;
                let first = b.dropped == 1;
                drop(b);
                // Said at once, once per run of drops: a guest that floods and then stops
                // logging would otherwise never have its drops reported (the count comes with
                // its next line that gets through).
                if first {
                    tracing::warn!(
                        consumer_id = &*self.consumer_id,
                        "plugin logged too fast; lines were dropped (until its budget refills)"
                    );
                }
                return;
            }
            b.tokens -= 1.0;
            std::mem::take(&mut b.dropped)
        };
        let consumer_id = &*self.consumer_id;
        if dropped > 0 {
            tracing::warn!(
                consumer_id,
                dropped,
                "plugin logged too fast; lines were dropped"
            );
        }
        let line = truncate(line.trim_end(), MAX_LINE);
        if let Some(sink) = &self.sink {
            let context = self.context.lock().clone();
            let record = serde_json::json!({
                "level": format!("{level:?}").to_lowercase(),
                "message": line,
                "topic": context.as_ref().map(|c| c.topic.as_str()),
                "partition": context.as_ref().map(|c| c.partition),
                "offset": context.as_ref().map(|c| c.offset),
                "version": context.as_ref().map(|c| c.version.as_str()),
            });
            let _ = sink.try_send(LogRecord {
                consumer_id: self.consumer_id.clone(),
                json: record.to_string(),
            });
        }
        let line = escape_controls(line);
        match level {
            GuestLevel::Trace => tracing::trace!(consumer_id, source, "{line}"),
            GuestLevel::Debug => tracing::debug!(consumer_id, source, "{line}"),
            GuestLevel::Info => tracing::info!(consumer_id, source, "{line}"),
            GuestLevel::Warn => tracing::warn!(consumer_id, source, "{line}"),
            GuestLevel::Error => tracing::error!(consumer_id, source, "{line}"),
        }
    }
}

/// `text` with its control characters written as escapes — `\n`, `\r`, `\t`, and `\u{1b}` for
/// the others (every C0 and C1 control and DEL), as well as the Unicode line and paragraph
/// separators — so that it is one line of plain text wherever it is printed. Backslashes stay as
/// they are: the text stays readable, and a line still cannot end early or carry a terminal
/// escape.
pub fn escape_controls(text: &str) -> Cow<'_, str> {
    let special = |c: char| c.is_control() || matches!(c, '\u{2028}' | '\u{2029}');
    if !text.contains(special) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        match c {
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if special(c) => out.push_str(&format!("\\u{{{:x}}}", u32::from(c))),
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

fn truncate(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// A guest's stdout or stderr: bytes are split into lines and logged.
pub struct GuestOutput {
    log: GuestLog,
    source: &'static str,
    level: GuestLevel,
    partial: Arc<Mutex<Vec<u8>>>,
}

impl GuestOutput {
    /// stdout (info) or stderr (warn) of a guest.
    pub fn new(log: GuestLog, stderr: bool) -> Self {
        Self {
            log,
            source: if stderr { "stderr" } else { "stdout" },
            level: if stderr {
                GuestLevel::Warn
            } else {
                GuestLevel::Info
            },
            partial: Arc::default(),
        }
    }

    fn clone_stream(&self) -> Self {
        Self {
            log: self.log.clone(),
            source: self.source,
            level: self.level,
            partial: self.partial.clone(),
        }
    }

    fn take(&self, bytes: &[u8]) {
        let mut partial = self.partial.lock();
        partial.extend_from_slice(bytes);
        while let Some(nl) = partial.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = partial.drain(..=nl).collect();
            self.log
                .emit(self.level, self.source, &String::from_utf8_lossy(&line));
        }
        if partial.len() > MAX_LINE {
            let line: Vec<u8> = std::mem::take(&mut *partial);
            self.log
                .emit(self.level, self.source, &String::from_utf8_lossy(&line));
        }
    }
}

impl wasmtime_wasi::cli::IsTerminal for GuestOutput {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl wasmtime_wasi::cli::StdoutStream for GuestOutput {
    fn p2_stream(&self) -> Box<dyn OutputStream> {
        Box::new(self.clone_stream())
    }

    fn async_stream(&self) -> Box<dyn tokio::io::AsyncWrite + Send + Sync> {
        // Only the WASIp2 stream is used; an empty sink keeps the contract of the trait.
        Box::new(tokio::io::sink())
    }
}

#[async_trait::async_trait]
impl OutputStream for GuestOutput {
    fn write(&mut self, bytes: Bytes) -> Result<(), StreamError> {
        self.take(&bytes);
        Ok(())
    }
    fn flush(&mut self) -> Result<(), StreamError> {
        Ok(())
    }
    fn check_write(&mut self) -> Result<usize, StreamError> {
        Ok(64 * 1024)
    }
}

#[async_trait::async_trait]
impl Pollable for GuestOutput {
    async fn ready(&mut self) {}
}
