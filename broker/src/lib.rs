//! mmmq: a durable message broker in one binary.
//!
//! # Layout
//! - [`storage`]: the segment store: framing, segments and indexes, the group-commit log,
//!   recovery, checkpoints, and the file abstraction under all of it.
//! - [`inspect`]: `mmmq inspect`, an offline reader of a topic directory for when a disk misbehaves.
//! - [`bench`]: `mmmq bench`, benchmarks that print JSON lines.
#![deny(missing_docs)]

pub mod bench;
pub mod inspect;
pub mod storage;
