//! `dispatchers.json` parsing on arbitrary text: never panics; an accepted file is valid by the
//! rules of docs/dispatchers.md (unique consumerIds, exactly one target each).
#![no_main]

use std::collections::HashSet;
use std::path::Path;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let root = Path::new("/nonexistent-root");
    if let Ok(specs) =
        mmmq::config::parse_dispatchers(text, &root.join("dispatchers.json"), root)
    {
        let ids: HashSet<_> = specs.iter().map(|s| s.consumer_id.to_string()).collect();
        assert_eq!(ids.len(), specs.len(), "duplicate consumerIds accepted");
    }
});
