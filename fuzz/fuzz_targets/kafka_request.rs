//! One Kafka request frame on arbitrary bytes, read as a connection reads it (header, version,
//! body, and a produce's record batches, decompressed within a limit): never a panic or an
//! abort, whatever the bytes say (docs/kafka.md, "Bad input").
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = mmmq::kafka::read_request(data, 1 << 20);
});
