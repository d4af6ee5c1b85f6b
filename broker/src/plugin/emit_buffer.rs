//! What one call of a 0.2.0 plugin emits (docs/plugins.md, "WebAssembly handlers"), checked as the guest
//! emits it and held until the call's verdict is known: the caller appends it only after an
//! `ack` (through [`crate::emit`]), and drops it after anything else, so nothing a call that
//! nacks, traps or times out emitted is ever visible.

use serde_json::value::RawValue;

use crate::produce::{ProduceError, ProduceItem};

/// Most messages one call may emit.
pub const MAX_EMITS_PER_CALL: usize = 1000;

/// How many times the message limit (`--max-body-bytes`) one call may emit in all.
pub const EMIT_BYTES_FACTOR: usize = 32;

/// The emits of the call in progress.
#[derive(Debug, Default)]
pub struct EmitBuffer {
    items: Vec<ProduceItem>,
    bytes: usize,
    max_message_bytes: usize,
}

impl EmitBuffer {
    /// An empty buffer for messages of at most `max_message_bytes` each.
    pub fn new(max_message_bytes: usize) -> Self {
        Self {
            items: Vec::new(),
            bytes: 0,
            max_message_bytes,
        }
    }

    /// Checks and keeps one emit; the error is what the guest sees, and nothing is kept.
    pub fn push(
        &mut self,
        topic: String,
        key: Option<String>,
        content: String,
    ) -> Result<(), String> {
        if self.items.len() >= MAX_EMITS_PER_CALL {
            return Err(format!(
                "a call may emit at most {MAX_EMITS_PER_CALL} messages"
            ));
        }
        let budget = self.max_message_bytes.saturating_mul(EMIT_BYTES_FACTOR);
        if self.bytes.saturating_add(content.len()) > budget {
            return Err(format!(
                "a call may emit at most {budget} bytes of content ({EMIT_BYTES_FACTOR} × the message limit)"
            ));
        }
        let len = content.len();
        let content =
            RawValue::from_string(content).map_err(|e| format!("content is not JSON: {e}"))?;
        let item = ProduceItem::new(topic, key, content, self.max_message_bytes).map_err(
            |e| match e {
                ProduceError::InternalTopic(t) => {
                    format!("topic {t:?} is internal (its name starts with \"__\"); plugins cannot emit to it")
                }
                e => e.to_string(),
            },
        )?;
        self.bytes += len;
        self.items.push(item);
        Ok(())
    }

    /// What the call emitted, in order; the buffer is empty for the next call.
    pub fn take(&mut self) -> Vec<ProduceItem> {
        self.bytes = 0;
        std::mem::take(&mut self.items)
    }

    /// Forgets what the call emitted (its verdict was not `ack`, or it faulted).
    pub fn clear(&mut self) {
        self.items.clear();
        self.bytes = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_rule_refuses_with_its_reason_and_keeps_nothing() {
        let mut b = EmitBuffer::new(10);
        let refused =
            |b: &mut EmitBuffer, t: &str, c: &str| b.push(t.into(), None, c.into()).unwrap_err();
        assert!(refused(&mut b, "__dlq.x", "1").contains("internal"));
        assert!(refused(&mut b, "a b", "1").contains("topic"));
        assert!(refused(&mut b, "t", "{nope").contains("not JSON"));
        assert!(refused(&mut b, "t", "\"01234567890\"").contains("limit is 10"));
        assert!(b.take().is_empty());
        // 32 × 10 bytes in all: 40 emits of 8 bytes fit, the 41st does not.
        for _ in 0..40 {
            b.push("t".into(), Some("k".into()), "\"123456\"".into())
                .unwrap();
        }
        assert!(refused(&mut b, "t", "1").contains("320 bytes"));
        assert_eq!(b.take().len(), 40);
        let mut b = EmitBuffer::new(1 << 20);
        for _ in 0..MAX_EMITS_PER_CALL {
            b.push("t".into(), None, "1".into()).unwrap();
        }
        assert!(refused(&mut b, "t", "1").contains("at most 1000 messages"));
        b.clear();
        assert!(b.take().is_empty());
    }
}
