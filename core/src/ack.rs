//! The acknowledgement both the broker (to producers) and consumers (to the broker) answer with.

use serde::{Deserialize, Serialize};

/// `ACK` or `NACK`, spelled in upper case on the wire as in MMMQ.
///
/// For a producer, `Ack` means the message is durable; for a consumer, that it is done with the
/// message and the broker may move its checkpoint past it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "UPPERCASE")]
pub enum Ack {
    /// Accepted (producer: durable; consumer: handled).
    Ack,
    /// Refused (producer: not made durable; consumer: redeliver, then dead-letter).
    Nack,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wire_spelling_is_upper_case() {
        assert_eq!(serde_json::to_string(&Ack::Ack).unwrap(), r#""ACK""#);
        assert_eq!(serde_json::to_string(&Ack::Nack).unwrap(), r#""NACK""#);
        assert_eq!(serde_json::from_str::<Ack>(r#""NACK""#).unwrap(), Ack::Nack);
        assert!(serde_json::from_str::<Ack>(r#""nack""#).is_err());
    }
}
