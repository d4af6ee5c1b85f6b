//! A Kafka client made of the `kafka-protocol` crate, for tests that send exactly the bytes a
//! real client's retry or a broken client sends (docs/kafka.md).

use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use kafka_protocol::messages::offset_commit_request::{
    OffsetCommitRequestPartition, OffsetCommitRequestTopic,
};
use kafka_protocol::messages::offset_fetch_request::OffsetFetchRequestTopic;
use kafka_protocol::messages::{
    ApiKey, GroupId, OffsetCommitRequest, OffsetFetchRequest, OffsetFetchResponse, RequestHeader,
    ResponseHeader, TopicName,
};
use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// One connection speaking Kafka.
pub struct Conn {
    pub stream: TcpStream,
    correlation: i32,
}

impl Conn {
    /// Connects to `addr`.
    pub async fn open(addr: &str) -> Self {
        Conn {
            stream: TcpStream::connect(addr).await.unwrap(),
            correlation: 0,
        }
    }

    /// Sends `body` as `key` at `version` and reads the answer's body.
    pub async fn call<Req: Encodable, Resp: Decodable>(
        &mut self,
        key: ApiKey,
        version: i16,
        body: &Req,
    ) -> Resp {
        self.call_with_tail(key, version, body, &[]).await
    }

    /// [`Conn::call`] with `tail` sent after the body, in the same frame (as some clients do).
    pub async fn call_with_tail<Req: Encodable, Resp: Decodable>(
        &mut self,
        key: ApiKey,
        version: i16,
        body: &Req,
        tail: &[u8],
    ) -> Resp {
        self.correlation += 1;
        let mut frame = BytesMut::new();
        RequestHeader::default()
            .with_request_api_key(key as i16)
            .with_request_api_version(version)
            .with_correlation_id(self.correlation)
            .with_client_id(Some(StrBytes::from_static_str("wire-test")))
            .encode(&mut frame, key.request_header_version(version))
            .unwrap();
        body.encode(&mut frame, version).unwrap();
        frame.put_slice(tail);
        self.send_raw(&frame).await;
        let mut answer = self.read_frame().await.expect("an answer");
        let header =
            ResponseHeader::decode(&mut answer, key.response_header_version(version)).unwrap();
        assert_eq!(header.correlation_id, self.correlation);
        Resp::decode(&mut answer, version).unwrap()
    }

    /// A SaslHandshake for PLAIN at `version`, which must be taken.
    pub async fn sasl_handshake(&mut self, version: i16) {
        use kafka_protocol::messages::{SaslHandshakeRequest, SaslHandshakeResponse};
        let h: SaslHandshakeResponse = self
            .call(
                ApiKey::SaslHandshake,
                version,
                &SaslHandshakeRequest::default().with_mechanism(StrBytes::from_static_str("PLAIN")),
            )
            .await;
        assert_eq!(h.error_code, 0);
    }

    pub async fn send_raw(&mut self, frame: &[u8]) {
        let mut out = BytesMut::with_capacity(frame.len() + 4);
        out.put_i32(frame.len() as i32);
        out.put_slice(frame);
        self.stream.write_all(&out).await.unwrap();
    }

    /// The next frame, or `None` once the broker closed the connection.
    pub async fn read_frame(&mut self) -> Option<Bytes> {
        let size = tokio::time::timeout(Duration::from_secs(10), self.stream.read_i32())
            .await
            .expect("an answer or a close within 10 s")
            .ok()?;
        let mut buf = vec![0u8; size as usize];
        self.stream.read_exact(&mut buf).await.ok()?;
        Some(Bytes::from(buf))
    }
}

/// `body` as `key` at `version` with its request header: a frame without its size, for tests
/// that send it as they like (raw, cut, late).
pub fn request_frame<Req: Encodable>(key: ApiKey, version: i16, body: &Req) -> BytesMut {
    let mut frame = BytesMut::new();
    RequestHeader::default()
        .with_request_api_key(key as i16)
        .with_request_api_version(version)
        .with_correlation_id(1)
        .encode(&mut frame, key.request_header_version(version))
        .unwrap();
    body.encode(&mut frame, version).unwrap();
    frame
}

/// Connects to `addr` and logs in with SASL/PLAIN (SaslHandshake v1, SaslAuthenticate v2) with
/// `password`: the connection, SaslAuthenticate's error code, and how long its answer took.
pub async fn sasl_plain(addr: &str, password: &str) -> (Conn, i16, std::time::Duration) {
    use kafka_protocol::messages::{SaslAuthenticateRequest, SaslAuthenticateResponse};
    let mut c = Conn::open(addr).await;
    c.sasl_handshake(1).await;
    let started = std::time::Instant::now();
    let a: SaslAuthenticateResponse = c
        .call(
            ApiKey::SaslAuthenticate,
            2,
            &SaslAuthenticateRequest::default()
                .with_auth_bytes(Bytes::from(format!("\0user\0{password}"))),
        )
        .await;
    (c, a.error_code, started.elapsed())
}

fn str_bytes(v: &str) -> StrBytes {
    StrBytes::from_string(v.to_owned())
}

/// A standalone commit (no member, generation −1) of `offset` in `topic`'s partition 0.
pub fn commit(
    group: &str,
    topic: &str,
    offset: i64,
    metadata: Option<&str>,
) -> OffsetCommitRequest {
    OffsetCommitRequest::default()
        .with_group_id(GroupId(str_bytes(group)))
        .with_generation_id_or_member_epoch(-1)
        .with_topics(vec![
            OffsetCommitRequestTopic::default()
                .with_name(TopicName(str_bytes(topic)))
                .with_partitions(vec![
                    OffsetCommitRequestPartition::default()
                        .with_partition_index(0)
                        .with_committed_offset(offset)
                        .with_committed_metadata(metadata.map(str_bytes)),
                ]),
        ])
}

/// `group`'s committed offset and metadata of `topic`'s partition 0 (OffsetFetch v7): the
/// partition's error code, or the group's (then −1 and nothing).
pub async fn fetched(c: &mut Conn, group: &str, topic: &str) -> (i16, i64, String) {
    let r: OffsetFetchResponse = c
        .call(
            ApiKey::OffsetFetch,
            7,
            &OffsetFetchRequest::default()
                .with_group_id(GroupId(str_bytes(group)))
                .with_topics(Some(vec![
                    OffsetFetchRequestTopic::default()
                        .with_name(TopicName(str_bytes(topic)))
                        .with_partition_indexes(vec![0]),
                ])),
        )
        .await;
    if r.error_code != 0 {
        return (r.error_code, -1, String::new());
    }
    let p = &r.topics[0].partitions[0];
    (
        p.error_code,
        p.committed_offset,
        p.metadata
            .as_ref()
            .map(|m| m.to_string())
            .unwrap_or_default(),
    )
}
