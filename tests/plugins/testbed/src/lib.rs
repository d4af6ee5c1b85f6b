//! The end-to-end tests' plugin. It logs `testbed version=V topic=T offset=N seen=S key=K
//! content=C` for every message it handles (V is `TESTBED_VERSION` at build time, so the tests can
//! build two versions; S counts the messages this instance has handled, so the tests can tell
//! which messages shared an instance), then does
//! what the content's `"do"` says: `loop`, `alloc` (until memory runs out), `stack` (unbounded
//! recursion), `panic`, `nack`, `flood` (10,000 log lines), `biglog` (one 8 MiB line); anything
//! else is ACKed.

use std::sync::atomic::{AtomicU64, Ordering};

use mmmq_plugin_sdk::{Ack, Message, info};

const VERSION: &str = match option_env!("TESTBED_VERSION") {
    Some(v) => v,
    None => "v1",
};

#[inline(never)]
#[allow(unconditional_recursion)] // the point: overflow the stack
fn recurse(n: u64, buf: &mut [u8; 256]) -> u64 {
    buf[(n % 256) as usize] = n as u8;
    let mut next = [0u8; 256];
    recurse(n + 1, &mut next) + u64::from(std::hint::black_box(buf[0]))
}

/// Messages this instance has handled (an instance's statics live as long as it does).
static SEEN: AtomicU64 = AtomicU64::new(0);

/// See the crate documentation.
pub fn handle(msg: Message) -> Ack {
    let seen = SEEN.fetch_add(1, Ordering::Relaxed) + 1;
    info!(
        "testbed version={VERSION} topic={} offset={} seen={seen} key={:?} content={}",
        msg.topic, msg.offset, msg.key, msg.content
    );
    let action = msg
        .value()
        .ok()
        .and_then(|v| v.get("do").and_then(|d| d.as_str()).map(str::to_owned));
    match action.as_deref() {
        Some("loop") => {
            let mut i = 0u64;
            loop {
                i = std::hint::black_box(i.wrapping_add(1));
            }
        }
        Some("alloc") => {
            let mut hoard: Vec<Vec<u8>> = Vec::new();
            loop {
                hoard.push(vec![1u8; 1 << 20]);
                std::hint::black_box(&hoard);
            }
        }
        Some("stack") => {
            let mut buf = [0u8; 256];
            std::hint::black_box(recurse(0, &mut buf));
            Ack::Ack
        }
        Some("panic") => panic!("testbed was told to panic"),
        Some("nack") => Ack::Nack,
        Some("biglog") => {
            // An 8 MiB argument to a host call: the host must copy it out of the guest's memory
            // and cut it, not keep it.
            info!("{}", "x".repeat(8 << 20));
            Ack::Ack
        }
        Some("flood") => {
            for i in 0..10_000 {
                info!("flood line {i}");
            }
            Ack::Ack
        }
        _ => Ack::Ack,
    }
}

mmmq_plugin_sdk::export!(handle);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_messages_are_acked_and_nack_is_nacked() {
        assert_eq!(handle(Message::new("t", r#"{"n":1}"#)), Ack::Ack);
        assert_eq!(handle(Message::new("t", r#"{"do":"nack"}"#)), Ack::Nack);
    }
}
