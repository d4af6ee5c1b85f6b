//! Per-key rate limit: at most `LIMIT` messages per key in any `WINDOW_MS` window of message time
//! (the broker's timestamps, so a replay gives the same answers). Messages over the limit are
//! NACKed, so with `maxNackRetries: 0` a flood from one key is set aside in the dead-letter topic
//! while everyone else's messages flow. Messages without a key are never limited.
//!
//! The plugin keeps its state in the instance between calls: mmmq gives each (dispatcher, topic)
//! its own instance, so a window counts one topic's messages, all of them; it starts afresh after
//! a reload or a trap (which forgets the window).

use std::cell::RefCell;
use std::collections::{HashMap, VecDeque};

use mmmq_plugin_sdk::{Ack, Message, info};

/// Messages allowed per key per window.
pub const LIMIT: usize = 5;
/// The window, in milliseconds of message time.
pub const WINDOW_MS: u64 = 1_000;
/// Keys remembered at most; the oldest are forgotten first.
pub const MAX_KEYS: usize = 10_000;

/// The sliding windows of recent keys.
#[derive(Default)]
pub struct Limiter {
    recent: HashMap<String, VecDeque<u64>>,
    order: VecDeque<String>,
}

impl Limiter {
    /// Whether a message with `key` at `timestamp` is within the limit (and counts it if so).
    pub fn allow(&mut self, key: &str, timestamp: u64) -> bool {
        if !self.recent.contains_key(key) {
            if self.order.len() >= MAX_KEYS
                && let Some(old) = self.order.pop_front()
            {
                self.recent.remove(&old);
            }
            self.order.push_back(key.to_owned());
        }
        let times = self.recent.entry(key.to_owned()).or_default();
        while times.front().is_some_and(|&t| t + WINDOW_MS <= timestamp) {
            times.pop_front();
        }
        if times.len() >= LIMIT {
            return false;
        }
        times.push_back(timestamp);
        true
    }
}

thread_local! {
    static LIMITER: RefCell<Limiter> = RefCell::new(Limiter::default());
}

/// ACK within the limit, NACK over it.
pub fn handle(msg: Message) -> Ack {
    let Some(key) = &msg.key else { return Ack::Ack };
    if LIMITER.with(|l| l.borrow_mut().allow(key, msg.timestamp)) {
        Ack::Ack
    } else {
        info!(
            "key {key} over {LIMIT} per {WINDOW_MS} ms: offset {} set aside",
            msg.offset
        );
        Ack::Nack
    }
}

mmmq_plugin_sdk::export!(handle);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flood_from_one_key_is_limited_and_others_flow() {
        let mut l = Limiter::default();
        for i in 0..LIMIT as u64 {
            assert!(l.allow("noisy", i));
        }
        assert!(!l.allow("noisy", 10));
        assert!(l.allow("quiet", 10));
        // The window slides.
        assert!(l.allow("noisy", WINDOW_MS + 1));
    }

    #[test]
    fn messages_without_a_key_are_never_limited() {
        for _ in 0..100 {
            assert_eq!(handle(Message::new("t", "1")), Ack::Ack);
        }
        let keyed = |ts| {
            let mut m = Message::new("t", "1").with_key("k");
            m.timestamp = ts;
            handle(m)
        };
        let answers: Vec<Ack> = (0..7).map(|_| keyed(1_000)).collect();
        assert_eq!(answers.iter().filter(|a| **a == Ack::Nack).count(), 2);
    }

    #[test]
    fn memory_is_bounded() {
        let mut l = Limiter::default();
        for k in 0..MAX_KEYS + 100 {
            l.allow(&k.to_string(), 0);
        }
        assert_eq!(l.recent.len(), MAX_KEYS);
    }
}
