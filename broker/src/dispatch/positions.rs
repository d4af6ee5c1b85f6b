//! Where a worker's position is kept: the partition's checkpoint files on one broker, the
//! cluster's metadata for a clustered partition's leader (docs/cluster.md, "Delivery in a
//! cluster").

use std::sync::Arc;

use mmmq_core::ConsumerId;

use super::worker::{Stopped, Worker};
use crate::storage::Position;
use crate::topics::Partition;
use crate::topics::delivery::DeliveryGrant;

/// A worker's position store.
#[derive(Clone)]
pub(super) enum Positions {
    /// The partition's `checkpoints/` files (single broker).
    Files(Arc<Partition>),
    /// Replicated through the cluster, valid in the grant's term.
    Replicated(Arc<dyn DeliveryGrant>),
}

impl Positions {
    /// The stored position of `id`, `None` if it never stored one.
    pub(super) async fn read(&self, id: &ConsumerId) -> Result<Option<Position>, String> {
        match self {
            Self::Files(p) => {
                let (p, id) = (p.clone(), id.clone());
                tokio::task::spawn_blocking(move || p.checkpoints.read_position(&id))
                    .await
                    .expect("checkpoint read panicked")
                    .map_err(|e| e.to_string())
            }
            Self::Replicated(grant) => Ok(grant.read(id.as_str())),
        }
    }

    /// Durably stores `position` of `id`.
    pub(super) async fn write(&self, id: &ConsumerId, position: &Position) -> Result<(), String> {
        match self {
            Self::Files(p) => {
                let (p, id, position) = (p.clone(), id.clone(), position.clone());
                tokio::task::spawn_blocking(move || p.checkpoints.write_position(&id, &position))
                    .await
                    .expect("checkpoint write panicked")
                    .map_err(|e| e.to_string())
            }
            Self::Replicated(grant) => grant.write(id.as_str(), position).await,
        }
    }
}

impl Worker {
    /// This worker's position store.
    pub(super) fn positions(&self) -> Positions {
        match &self.grant {
            Some(grant) => Positions::Replicated(grant.clone()),
            None => Positions::Files(self.partition.clone()),
        }
    }

    /// Right before a send: in a cluster, whether this broker may still deliver the partition
    /// (its lease renewed if it lapsed); a worker that may not stops.
    pub(super) async fn may_send(&self) -> Result<(), Stopped> {
        match &self.grant {
            Some(grant) if !grant.may_send().await => Err(Stopped),
            _ if self.cancel.is_cancelled() => Err(Stopped),
            _ => Ok(()),
        }
    }
}
