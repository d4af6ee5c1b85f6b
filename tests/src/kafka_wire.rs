//! A Kafka client made of the `kafka-protocol` crate, for tests that send exactly the bytes a
//! real client's retry or a broken client sends (docs/kafka.md).

use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use kafka_protocol::messages::{ApiKey, RequestHeader, ResponseHeader};
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
