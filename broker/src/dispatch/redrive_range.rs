//! What a redrive worker covers of a dead-letter partition (docs/delivery.md, "Dead-letter redrive"): the
//! worker stops at its end, and `redrive` starts workers with one. Its own module, below both, so
//! that `redrive` depends on `worker` and not the other way round.

/// What a redrive worker covers of its partition.
#[derive(Debug, Clone, Copy)]
pub(super) struct Range {
    /// Where it starts (`None`: the checkpoint).
    pub from: Option<u64>,
    /// Where it stops (exclusive).
    pub to: u64,
}
