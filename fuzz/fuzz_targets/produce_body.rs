//! The bodies of `POST /mmmq/messages` and `/mmmq/messages/batch` on arbitrary bytes: never panic;
//! what is accepted has a valid, non-internal topic and content that is JSON no deeper than the
//! limit, reproduced byte for byte.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mmmq::http::produce::{parse_batch, parse_message};

const MAX: usize = 1 << 20;

fn check(item: &mmmq::broker::ProduceItem) {
    assert!(!item.topic().is_internal());
    // serde_json refuses nesting past 128 and numbers beyond a float: what a consumer parsing
    // the content into a tree would hit.
    let parsed = serde_json::from_str::<serde_json::Value>(item.content().get());
    assert!(parsed.is_ok(), "accepted content a consumer cannot parse: {parsed:?}");
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
