//! The entry decoder on arbitrary bytes: never panics, and whatever it accepts re-encodes to the
//! same frame.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mmmq::storage::frame;

fuzz_target!(|data: &[u8]| {
    if let Ok(payload) = frame::decode(data) {
        let again = frame::encode(payload);
        assert_eq!(&data[..again.len()], &again[..]);
    }
});
