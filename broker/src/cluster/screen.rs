//! What the receiving end of Raft's traffic (`rpc`) refuses before a group sees a message
//! (docs/cluster.md, "Who may speak for the cluster"): the guard has made sure it is a member's,
//! and this makes sure a member's bug cannot stop a group either.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use openraft::raft::AppendEntriesRequest;

use super::network::GroupId;
use super::types::{Command, Raft};

/// The highest term a message may carry. Terms grow by one an election; a forged one near
/// `u64::MAX`, persisted as a vote, would overflow the next election's. No cluster reaches
/// 2^48 elections.
pub const MAX_TERM: u64 = 1 << 48;

/// What the RPC layer refuses before a group sees it: a term past [`MAX_TERM`], or entries
/// of the wrong kind for the group (a message in the metadata group, a metadata change in a
/// partition's), which its storage could only fail on.
pub(super) fn refused(why: String) -> Response {
    (
        StatusCode::BAD_REQUEST,
        format!("a Raft message refused: {why}"),
    )
        .into_response()
}

pub(super) fn check_term(term: u64) -> Result<(), String> {
    if term > MAX_TERM {
        return Err(format!("term {term} is past the highest, {MAX_TERM}"));
    }
    Ok(())
}

pub(super) fn check_kinds<'a>(
    group: &GroupId,
    commands: impl IntoIterator<Item = &'a Command>,
) -> Result<(), String> {
    for command in commands {
        match (group, command) {
            (GroupId::Meta, Command::Meta(_)) | (GroupId::Partition(..), Command::Message(_)) => {}
            (GroupId::Meta, Command::Message(_)) => {
                return Err("a message entry for the metadata group".into());
            }
            (GroupId::Partition(..), Command::Meta(_)) => {
                return Err(format!("a metadata entry for partition {group}"));
            }
        }
    }
    Ok(())
}

pub(super) fn check_append(
    group: &GroupId,
    req: &AppendEntriesRequest<Raft>,
) -> Result<(), String> {
    check_term(req.vote.leader_id.term)?;
    check_kinds(
        group,
        req.entries.iter().filter_map(|e| match &e.payload {
            openraft::EntryPayload::Normal(c) => Some(c),
            _ => None,
        }),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_of_the_wrong_kind_and_terms_past_the_highest_are_refused() {
        let meta = GroupId::Meta;
        let part = GroupId::Partition("t".into(), 0);
        let message = Command::Message(bytes::Bytes::from_static(b"m"));
        let change = Command::Meta(bytes::Bytes::from_static(b"{}"));
        assert!(check_kinds(&meta, [&change]).is_ok());
        assert!(check_kinds(&part, [&message]).is_ok());
        assert!(check_kinds(&meta, [&change, &message]).is_err());
        assert!(check_kinds(&part, [&change]).is_err());
        assert!(check_term(MAX_TERM).is_ok());
        assert!(check_term(u64::MAX).is_err());
    }
}
