//! The bodies of `POST /mmmq/messages` and `/mmmq/messages/batch` on arbitrary bytes: never panic;
//! what is accepted has a valid, non-internal topic and content that is JSON no deeper than the
//! limit, reproduced byte for byte.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mmmq::http::produce::{parse_batch, parse_message};

const MAX: usize = 1 << 20;

fn check(item: &mmmq::broker::ProduceItem) {
    assert!(!item.topic.is_internal());
    let content = item.content.get();
    let value: serde_json::Value = serde_json::from_str(content).expect("accepted content is JSON");
    drop(value);
    assert!(mmmq_core_depth(content) <= 128);
}

fn mmmq_core_depth(s: &str) -> usize {
    // Counted independently of the broker's own counter.
    let (mut depth, mut max, mut in_str, mut esc) = (0usize, 0usize, false, false);
    for b in s.bytes() {
        if in_str {
            match (esc, b) {
                (true, _) => esc = false,
                (false, b'\\') => esc = true,
                (false, b'"') => in_str = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_str = true,
            b'[' | b'{' => {
                depth += 1;
                max = max.max(depth);
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    max
}

fuzz_target!(|data: &[u8]| {
    if let Ok(item) = parse_message(data, MAX) {
        check(&item);
    }
    if let Ok(items) = parse_batch(data, MAX) {
        assert!(!items.is_empty());
        items.iter().for_each(check);
    }
});
