//! A 0.1.0 plugin, as plugins were built before the 0.2.0 world: it logs `legacy topic=T
//! offset=N` for each message and ACKs it, or NACKs content containing `"nack"`.

#![allow(clippy::too_many_arguments)] // generated code

wit_bindgen::generate!({
    world: "handler",
    path: "../../../wit",
});

use mmmq::plugin::log::{Level, log};

struct Legacy;

impl Guest for Legacy {
    fn handle(message: Message) -> Ack {
        log(
            Level::Info,
            &format!("legacy topic={} offset={}", message.topic, message.offset),
        );
        if message.content.contains("nack") {
            Ack::Nack
        } else {
            Ack::Ack
        }
    }
}

export!(Legacy);
