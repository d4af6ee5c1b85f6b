use std::collections::BTreeMap;
use std::time::Duration;

use futures_util::Stream;
use mmmq_core::{Envelope, GroupPoll, TopicPartition};

use crate::DedupeStore;
use crate::conn::{Conn, decode, status_error};
use crate::error::ClientError;

/// A member of a pull consumer group (`GET /mmmq/groups/{group}/messages`): the broker shares the
/// partitions of the topics `pattern` matches among the group's members and keeps the group's
/// committed offsets.
///
/// With auto-commit (the default) every poll first commits what the previous poll returned — the
/// batch the caller has processed by the time it asks for more — so a member that crashes or
/// loses its partitions hands over at most its last batch, which the next owner gets again
/// (at-least-once). [`GroupConsumer::commit`] commits explicitly.
#[derive(Debug)]
pub struct GroupConsumer {
    conn: Conn,
    group: String,
    member: String,
    pattern: String,
    max: usize,
    wait: Duration,
    session_timeout: Duration,
    auto_commit: bool,
    /// Next offsets of what was returned and not committed yet.
    pending: BTreeMap<TopicPartition, u64>,
    assignment: Vec<TopicPartition>,
    /// Exactly-once: the store, and the messages of the last poll, recorded at the next.
    dedupe: Option<DedupeStore>,
    unrecorded: Vec<(String, Option<mmmq_core::TopicId>, u32, u64)>,
}

impl GroupConsumer {
    /// Member `member` of group `group`, consuming the topics `pattern` matches.
    pub fn new(
        broker: &str,
        group: &str,
        member: &str,
        pattern: &str,
    ) -> Result<Self, ClientError> {
        Ok(Self {
            conn: Conn::new(broker, Duration::from_secs(60))?,
            group: group.to_owned(),
            member: member.to_owned(),
            pattern: pattern.to_owned(),
            max: 100,
            wait: Duration::from_secs(30),
            session_timeout: Duration::from_secs(10),
            auto_commit: true,
            pending: BTreeMap::new(),
            assignment: Vec::new(),
            dedupe: None,
            unrecorded: Vec::new(),
        })
    }

    /// Sends `Authorization: Bearer <token>`.
    pub fn auth_token(mut self, token: Option<String>) -> Self {
        self.conn.set_token(token);
        self
    }

    /// Most messages per poll (1–1000, default 100).
    pub fn max(mut self, max: usize) -> Self {
        self.max = max.clamp(1, 1000);
        self
    }

    /// Longest a poll waits when nothing is there (default 30 s, at most 30 s).
    pub fn wait(mut self, wait: Duration) -> Self {
        self.wait = wait.min(Duration::from_secs(30));
        self
    }

    /// How long the member may go without polling before the broker hands its partitions to the
    /// others (default 10 s).
    pub fn session_timeout(mut self, timeout: Duration) -> Self {
        self.session_timeout = timeout;
        self
    }

    /// Whether each poll commits what the previous one returned (default `true`).
    pub fn auto_commit(mut self, on: bool) -> Self {
        self.auto_commit = on;
        self
    }

    /// Exactly-once processing (docs/delivery.md, "Exactly-once consumers"): each poll first records the
    /// messages the previous poll returned as processed (durably, before committing them), and
    /// leaves out of its answer every message `store` has as processed — what the group delivers
    /// again after a broker restart, a lost commit or a rebalance.
    pub fn exactly_once(mut self, store: DedupeStore) -> Self {
        self.dedupe = Some(store);
        self
    }

    /// Exactly-once: records the last poll's messages as processed.
    async fn record_processed(&mut self) -> Result<(), ClientError> {
        let Some(store) = &self.dedupe else {
            return Ok(());
        };
        let items: Vec<crate::dedupe::MessageRef<'_>> = self
            .unrecorded
            .iter()
            .map(|(t, id, p, o)| (t.as_str(), *id, *p, *o))
            .collect();
        store.record(&items).await?;
        self.unrecorded.clear();
        Ok(())
    }

    /// The partitions this member owned at its last poll.
    pub fn assignment(&self) -> &[TopicPartition] {
        &self.assignment
    }

    /// The next messages of this member's partitions (after committing the previous batch, with
    /// auto-commit). A commit refused because the member lost a partition is dropped: its next
    /// owner delivers those messages again.
    pub async fn poll(&mut self) -> Result<Vec<Envelope>, ClientError> {
        self.record_processed().await?;
        if self.auto_commit {
            match self.commit().await {
                Ok(())
                | Err(ClientError::Rejected {
                    status: 404 | 409, ..
                }) => {}
                Err(e) => return Err(e),
            }
        }
        let path = format!(
            "/mmmq/groups/{}/messages?member={}&pattern={}&max={}&waitMs={}&sessionTimeoutMs={}",
            self.group,
            self.member,
            self.pattern,
            self.max,
            self.wait.as_millis(),
            self.session_timeout.as_millis()
        );
        match self.conn.send(reqwest::Method::GET, &path, None).await? {
            (200, bytes) => {
                let mut answer: GroupPoll = decode(&bytes)?;
                for e in &answer.messages {
                    let tp = TopicPartition {
                        topic: e.topic.to_string(),
                        partition: e.partition,
                        topic_id: e.topic_id,
                    };
                    self.pending.insert(tp, e.offset + 1);
                }
                self.assignment = answer.assignment;
                if let Some(store) = &self.dedupe {
                    answer.messages.retain(|e| {
                        let done =
                            store.is_done(e.topic.as_str(), e.topic_id, e.partition, e.offset);
                        if done {
                            store.count_duplicate();
                        }
                        !done
                    });
                    self.unrecorded = answer
                        .messages
                        .iter()
                        .map(|e| (e.topic.to_string(), e.topic_id, e.partition, e.offset))
                        .collect();
                }
                Ok(answer.messages)
            }
            (status, bytes) => Err(status_error(status, &bytes)),
        }
    }

    /// Commits everything returned so far. A partition the member no longer owns is refused with
    /// `409`, a group a restarted broker has not seen polled yet with `404`
    /// (`ClientError::Rejected`); nothing of that request is kept.
    pub async fn commit(&mut self) -> Result<(), ClientError> {
        self.record_processed().await?;
        if self.pending.is_empty() {
            return Ok(());
        }
        let offsets: Vec<serde_json::Value> = self
            .pending
            .iter()
            .map(|(tp, o)| match tp.topic_id {
                Some(id) => serde_json::json!({"topic": tp.topic, "topicId": id, "partition": tp.partition, "offset": o}),
                None => serde_json::json!({"topic": tp.topic, "partition": tp.partition, "offset": o}),
            })
            .collect();
        let body =
            serde_json::to_vec(&serde_json::json!({"member": self.member, "offsets": offsets}))?;
        let path = format!("/mmmq/groups/{}/commit", self.group);
        let result = match self
            .conn
            .send(reqwest::Method::POST, &path, Some(body))
            .await?
        {
            (200, _) => Ok(()),
            (status, bytes) => Err(status_error(status, &bytes)),
        };
        // Refused because the member no longer owns a partition (409), or because the broker
        // restarted and knows the group only from its committed offsets until the next poll
        // (404): the offsets will be delivered again from the last commit, so they are dropped
        // (kept, they would be refused forever and the member would never poll again).
        if matches!(
            result,
            Ok(())
                | Err(ClientError::Rejected {
                    status: 404 | 409,
                    ..
                })
        ) {
            self.pending.clear();
        }
        result
    }

    /// Leaves the group: its partitions go to the others at once.
    pub async fn leave(mut self) -> Result<(), ClientError> {
        if self.auto_commit {
            let _ = self.commit().await;
        }
        let path = format!("/mmmq/groups/{}/members/{}", self.group, self.member);
        match self.conn.send(reqwest::Method::DELETE, &path, None).await? {
            (200, _) => Ok(()),
            (status, bytes) => Err(status_error(status, &bytes)),
        }
    }

    /// Every message of the member's partitions, forever (auto-commit as in
    /// [`GroupConsumer::poll`]). Transient errors are yielded and retried with backoff.
    pub fn into_stream(self) -> impl Stream<Item = Result<Envelope, ClientError>> {
        crate::stream::envelopes(self)
    }
}

impl crate::stream::Polls for GroupConsumer {
    async fn poll_messages(&mut self) -> Result<Vec<Envelope>, ClientError> {
        self.poll().await
    }
}
