//! ACKs every message and does nothing else: what `mmmq bench plugin` measures the host against.

use mmmq_plugin_sdk::{Ack, Message};

/// ACK.
pub fn handle(_msg: Message) -> Ack {
    Ack::Ack
}

mmmq_plugin_sdk::export!(handle);
