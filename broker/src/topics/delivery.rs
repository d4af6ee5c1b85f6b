//! Who may deliver a clustered partition, and where its dispatchers' positions live
//! (docs/cluster.md, "Delivery in a cluster").
//!
//! On one broker every dispatcher delivers every partition and keeps its position in the
//! partition's `checkpoints/` files. In a cluster a partition is delivered by its leader only,
//! and positions are replicated so that the next leader continues from them. The cluster
//! implements these traits; dispatch only asks them, so that neither knows the other.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use crate::storage::Position;

/// A boxed future, for the traits' async methods.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A clustered partition's right to deliver.
pub trait DeliveryControl: Send + Sync {
    /// The broker that delivers the partition now (the last to take it over), if one did.
    fn delivered_by(&self) -> Option<u64>;
    /// The next offset of `consumer` as replicated (what `keepUndelivered` protects), if it
    /// stored one.
    fn stored_next(&self, consumer: &str) -> Option<u64>;

    /// Waits until this broker leads the partition, has applied every entry of the terms before
    /// its own, and fenced the partition's positions to its term; `None` once `stop` is
    /// cancelled.
    fn acquire<'a>(
        &'a self,
        stop: &'a CancellationToken,
    ) -> BoxFuture<'a, Option<Arc<dyn DeliveryGrant>>>;
}

/// The right to deliver a partition in one leader's term.
pub trait DeliveryGrant: Send + Sync {
    /// The term it is for.
    fn term(&self) -> u64;
    /// Cancelled once the term is over here (another leader, the group stopped, a lease that
    /// could not be renewed): delivery stops.
    fn lost(&self) -> &CancellationToken;
    /// Whether a message may be sent now: this broker still leads in the term and a quorum
    /// acknowledged it within a lease, renewed first if it lapsed. `false` ends the grant.
    fn may_send(&self) -> BoxFuture<'_, bool>;
    /// The position of `consumer` as the last leader left it.
    fn read(&self, consumer: &str) -> Option<Position>;
    /// Replicates `position` of `consumer`; `Ok` once a majority holds it and it counts (the
    /// term is still the partition's fence).
    fn write<'a>(
        &'a self,
        consumer: &'a str,
        position: &'a Position,
    ) -> BoxFuture<'a, Result<(), String>>;
}

/// Appends the broker makes itself (dead letters, plugins' emits and logs) to a cluster's topic:
/// through the metadata (a topic the cluster lacks is created there) and the partition's
/// leader, as a producer's message goes; a clustered log takes no local append.
pub trait ClusterAppend: Send + Sync {
    /// Appends `items` to `topic` (created, when missing, with `partitions` partitions), each
    /// routed by its `route` (its key, else its produce id) as a producer's message is, one
    /// write per partition; answers each one's partition and offset (the first copy's, for a
    /// produce id the partition already holds) once a majority holds them.
    fn append<'a>(
        &'a self,
        topic: &'a mmmq_core::Topic,
        partitions: u32,
        items: Vec<Appended>,
    ) -> BoxFuture<'a, Result<Vec<(u32, u64)>, String>>;
}

/// One message of a [`ClusterAppend`].
#[derive(Debug, Clone)]
pub struct Appended {
    /// What routes it: its key, else its produce id, else nothing (round robin).
    pub route: Option<String>,
    /// The stored message ([`mmmq_core::StoredMessage::to_payload`]).
    pub payload: Vec<u8>,
}

/// A partition's [`DeliveryControl`], set once the cluster serves the partition's topic.
pub struct DeliverySlot(tokio::sync::watch::Sender<Option<Arc<dyn DeliveryControl>>>);

impl Default for DeliverySlot {
    fn default() -> Self {
        Self(tokio::sync::watch::Sender::new(None))
    }
}

impl std::fmt::Debug for DeliverySlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.borrow().is_some() {
            "DeliverySlot(set)"
        } else {
            "DeliverySlot(unset)"
        })
    }
}

impl DeliverySlot {
    /// Sets the control (the first set stays).
    pub fn set(&self, control: Arc<dyn DeliveryControl>) {
        self.0.send_if_modified(|c| {
            if c.is_some() {
                return false;
            }
            *c = Some(control);
            true
        });
    }

    /// The control, if set.
    pub fn current(&self) -> Option<Arc<dyn DeliveryControl>> {
        self.0.borrow().clone()
    }

    /// The control, once set; `None` if `stop` is cancelled first.
    pub async fn get(&self, stop: &CancellationToken) -> Option<Arc<dyn DeliveryControl>> {
        let mut rx = self.0.subscribe();
        tokio::select! {
            c = rx.wait_for(Option::is_some) => c.ok().and_then(|c| c.clone()),
            _ = stop.cancelled() => None,
        }
    }
}
