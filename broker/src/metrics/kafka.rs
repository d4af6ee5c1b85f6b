//! The Kafka listener's metrics (docs/kafka.md, "Connections"): connections open, refused at
//! the door and closed for a reason, and failed logins. Registered with the broker's
//! [`super::Metrics`], so one scrape shows them.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// A reason label.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    /// Why.
    pub reason: String,
}

/// A failed authentication's labels (the names contract §16 gives them).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AuthLabel {
    /// `kafka` or `http`.
    pub listener: String,
    /// `PLAIN`, `token`, …
    pub mechanism: String,
}

/// See the module's comment.
#[derive(Default)]
pub struct KafkaMetrics {
    /// Kafka connections open now.
    pub connections_open: Gauge,
    /// Connections closed at once because their address held `--max-connections-per-ip`.
    pub connections_refused: Counter,
    /// Connections the broker closed, by reason (`frame_size`, `timeout`, `budget`, …).
    pub connections_closed: Family<ReasonLabel, Counter>,
    /// Failed logins, by listener and mechanism.
    pub auth_failures: Family<AuthLabel, Counter>,
}

impl KafkaMetrics {
    /// Registers every metric in `registry`.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "kafka_connections_open",
            "Kafka connections open now",
            self.connections_open.clone(),
        );
        registry.register(
            "kafka_connections_refused",
            "Kafka connections closed at once because their address held --max-connections-per-ip",
            self.connections_refused.clone(),
        );
        registry.register(
            "kafka_connections_closed",
            "Kafka connections the broker closed, by reason",
            self.connections_closed.clone(),
        );
        registry.register(
            "auth_failures",
            "Failed authentications, by listener and mechanism",
            self.auth_failures.clone(),
        );
    }

    /// Counts a connection the broker closed.
    pub fn closed(&self, reason: &str) {
        self.connections_closed
            .get_or_create(&ReasonLabel {
                reason: reason.to_owned(),
            })
            .inc();
    }

    /// Counts a failed Kafka login.
    pub fn auth_failed(&self, mechanism: &str) {
        self.auth_failures
            .get_or_create(&AuthLabel {
                listener: "kafka".to_owned(),
                mechanism: mechanism.to_owned(),
            })
            .inc();
    }
}
