//! The end-to-end tests' plugin. It logs `testbed version=V topic=T offset=N seen=S key=K
//! content=C` for every message it handles (V is `TESTBED_VERSION` at build time, so the tests can
//! build two versions; S counts the messages this instance has handled, so the tests can tell
//! which messages shared an instance). A message that does not follow the last one this instance
//! saw of its topic (the next offset, or the same again) is NACKed as an order violation.
//! Otherwise it does (unless built as `calm`, which ACKs everything)
//! what the content's `"do"` says: `loop`, `alloc` (until memory runs out), `stack` (unbounded
//! recursion), `panic`, `nack`, `flood` (10,000 log lines), `biglog` (one 8 MiB line), `sleep`
//! (`std::thread::sleep` of `"ms"`, an hour by default: a wait in the host's clock, not in
//! WebAssembly), `say` (logs `"text"` exactly as given, control characters included), and with the
//! 0.2.0 world: `retry` (`retry-after` `"ms"` until attempt `"until"`), `deadletter` (the verdict,
//! with `"reason"`), `config` (logs `config KEY=VALUE` for `"key"`), `emit` (see below), `http` (GET `"url"`, logs the answer);
//! anything else is ACKed. The
//! log line carries `attempt=A` after `seen=S`.

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};

use mmmq_plugin_sdk::{Ack, Message, Verdict, info};

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

thread_local! {
    /// The last offset this instance handled, per topic.
    static LAST: RefCell<HashMap<String, u64>> = RefCell::new(HashMap::new());
}

/// Whether `offset` may follow what this instance saw of `topic`: the next offset, or the same
/// one again (a NACK's resend). The `lanes` build checks per key instead (`topic` is then the
/// topic and key): a lane's instance sees its keys' messages in offset order, not every offset. Anything else is a gap or a step back in delivery, which the
/// broker must never make within one instance's life: the message is NACKed (and so ends in the
/// dead-letter topic, which tests check is empty), with a line in the log.
fn in_order(topic: &str, offset: u64) -> bool {
    LAST.with(|last| {
        let mut last = last.borrow_mut();
        match last.get(topic) {
            Some(&l) if VERSION == "lanes" && offset < l => false,
            Some(&l) if VERSION != "lanes" && offset != l && offset != l + 1 => false,
            _ => {
                last.insert(topic.to_owned(), offset);
                true
            }
        }
    })
}

/// See the crate documentation.
pub fn handle(msg: Message) -> Ack {
    let seen = SEEN.fetch_add(1, Ordering::Relaxed) + 1;
    info!(
        "testbed version={VERSION} topic={} offset={} seen={seen} attempt={} key={:?} content={}",
        msg.topic, msg.offset, msg.attempt, msg.key, msg.content
    );
    let stream = if VERSION == "lanes" {
        format!("{}/{:?}", msg.topic, msg.key)
    } else {
        msg.topic.clone()
    };
    if !in_order(&stream, msg.offset) {
        mmmq_plugin_sdk::error!(
            "testbed ORDER VIOLATION topic={} offset={}",
            msg.topic,
            msg.offset
        );
        return Ack::Nack;
    }
    // The `calm` build ignores what the content says: a well-behaved plugin next to a
    // misbehaving one, on the same messages.
    let action = msg
        .value()
        .ok()
        .filter(|_| VERSION != "calm")
        .and_then(|v| v.get("do").and_then(|d| d.as_str()).map(str::to_owned));
    let field = |name: &str| {
        msg.value()
            .ok()
            .and_then(|v| v.get(name).cloned())
            .unwrap_or_default()
    };
    match action.as_deref() {
        Some("retry") => {
            let until = field("until").as_u64().unwrap_or(2) as u32;
            if msg.attempt < until {
                Verdict::RetryAfter(field("ms").as_u64().unwrap_or(100) as u32)
            } else {
                Ack::Ack
            }
        }
        Some("deadletter") => {
            Verdict::DeadLetter(field("reason").as_str().unwrap_or("testbed").to_owned())
        }
        Some("emit") => {
            // After `spin` (below), `n` emits to `to` (content `{"from":offset,"i":i}`, or `raw` verbatim), then
            // whatever `then` says (`panic`, `nack`, `loop`, `config`: NACK if the config's
            // `verdict` is `nack`; ACK by default). A refused emit is logged as
            // `emit refused: …` and the rest are not tried.
            // `spin`: that many loop rounds first, so a test can make each call take a while.
            for i in 0..field("spin").as_u64().unwrap_or(0) {
                std::hint::black_box(i);
            }
            let to = field("to");
            let to = to.as_str().unwrap_or("emitted");
            let raw = field("raw");
            for i in 0..field("n").as_u64().unwrap_or(1) {
                let content = match raw.as_str() {
                    Some(r) => r.to_owned(),
                    None => format!(r#"{{"from":{},"i":{i}}}"#, msg.offset),
                };
                if let Err(e) = mmmq_plugin_sdk::emit(to, msg.key.as_deref(), &content) {
                    info!("{e}");
                    break;
                }
            }
            match field("then").as_str() {
                Some("panic") => panic!("testbed was told to panic after emitting"),
                Some("nack") => Ack::Nack,
                Some("config") if mmmq_plugin_sdk::config("verdict").as_deref() == Some("nack") => {
                    Ack::Nack
                }
                Some("loop") => loop {
                    std::hint::black_box(0u64);
                },
                _ => Ack::Ack,
            }
        }
        Some("http") => {
            // GET `url` (POST of `post` bytes when given); logs `http status=S body=B` or
            // `http error=E`, and ACKs either way.
            let url = field("url");
            let url = url.as_str().unwrap_or("");
            let sent = match field("post").as_u64() {
                Some(n) => mmmq_plugin_sdk::http::Request::new("POST", url)
                    .body(vec![b'x'; n as usize])
                    .send(),
                None => mmmq_plugin_sdk::http::get(url),
            };
            match sent {
                Ok(r) => info!("http status={} body={}", r.status, r.text().unwrap_or("?")),
                Err(e) => info!("http error={e}"),
            }
            Ack::Ack
        }
        Some("config") => {
            let key = field("key");
            let key = key.as_str().unwrap_or("");
            info!("config {key}={:?}", mmmq_plugin_sdk::config(key));
            Ack::Ack
        }
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
        Some("sleep") => {
            let ms = field("ms").as_u64().unwrap_or(3_600_000);
            std::thread::sleep(std::time::Duration::from_millis(ms));
            Ack::Ack
        }
        Some("say") => {
            info!("{}", field("text").as_str().unwrap_or(""));
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

    #[test]
    fn verdicts_and_config_of_the_second_world() {
        let retry = r#"{"do":"retry","ms":50,"until":3}"#;
        assert_eq!(handle(Message::new("r", retry)), Verdict::RetryAfter(50));
        assert_eq!(handle(Message::new("r", retry).attempt(3)), Ack::Ack);
        let dead = r#"{"do":"deadletter","reason":"no"}"#;
        assert_eq!(
            handle(Message::new("d", dead)),
            Verdict::DeadLetter("no".into())
        );
        mmmq_plugin_sdk::testing::set_config("k", "v");
        assert_eq!(mmmq_plugin_sdk::config("k").as_deref(), Some("v"));
    }
}
