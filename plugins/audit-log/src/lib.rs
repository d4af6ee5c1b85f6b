//! Audit log sink: records one line per message in the broker's log (topic, offset, key, size,
//! timestamp and a fingerprint of the content) and acknowledges it. Point it at `**` to get an
//! audit trail of everything that flows, without a consumer service to run.

use mmmq_plugin_sdk::{Ack, Message, info};

/// FNV-1a of the content: equal contents have equal fingerprints, so duplicates stand out.
fn fingerprint(content: &str) -> u64 {
    content.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// The audit line of one message.
pub fn audit_line(msg: &Message) -> String {
    format!(
        "audit topic={} offset={} key={} bytes={} timestamp={} fingerprint={:016x}",
        msg.topic,
        msg.offset,
        msg.key.as_deref().unwrap_or("-"),
        msg.content.len(),
        msg.timestamp,
        fingerprint(&msg.content)
    )
}

/// Logs and acknowledges every message.
pub fn handle(msg: Message) -> Ack {
    info!("{}", audit_line(&msg));
    Ack::Ack
}

mmmq_plugin_sdk::export!(handle);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_message_is_acknowledged_and_described() {
        let msg = Message::new("order.created", r#"{"id":1}"#)
            .with_key("c-7")
            .at(42);
        assert_eq!(handle(msg.clone()), Ack::Ack);
        let line = audit_line(&msg);
        assert!(
            line.starts_with("audit topic=order.created offset=42 key=c-7 bytes=8 "),
            "{line}"
        );
    }

    #[test]
    fn equal_content_has_equal_fingerprints() {
        let a = audit_line(&Message::new("a", "[1,2]"));
        let b = audit_line(&Message::new("b", "[1,2]").at(9));
        let c = audit_line(&Message::new("a", "[1,3]"));
        let fp = |l: &str| l.rsplit_once("fingerprint=").unwrap().1.to_owned();
        assert_eq!(fp(&a), fp(&b));
        assert_ne!(fp(&a), fp(&c));
    }
}
