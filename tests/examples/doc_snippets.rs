//! The Rust snippets of the documents, compiled (`cargo test` builds examples): each region
//! between `// snippet: NAME` and `// end snippet` is word for word a `rust` block of
//! docs/clients.md or docs/topics-and-groups.md, around it what the block takes as given
//! (`documents::the_rust_snippets_of_the_documents_compile` checks that they match). It is
//! never run. The plugin snippets are built in a fresh scaffold instead (tests/tests/readme.rs,
//! tests/tests/scaffold.rs).
#![allow(unused, clippy::all)]

use std::future::Future;

use futures_util::StreamExt;
use mmmq_client::{ClientError, DedupeStore};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize)]
struct Order {
    id: u64,
}

#[derive(Serialize, Deserialize)]
struct Notice {
    text: String,
}

async fn ship(_: Order) -> anyhow::Result<()> {
    Ok(())
}

async fn send_mail(_: &Notice) -> anyhow::Result<()> {
    Ok(())
}

async fn bill(_: mmmq_client::Envelope) {}

async fn handler(_: mmmq_client::Message<Order>) -> anyhow::Result<()> {
    Ok(())
}

#[rustfmt::skip]
async fn clients(
    order: Order,
    shutdown: impl Future<Output = ()> + Send + 'static,
    broker: &str,
    other_store: DedupeStore,
) -> anyhow::Result<()> {
    // snippet: clients
    use mmmq_client::{Admin, Consumer, DedupeStore, GroupConsumer, Message, Producer, PullConsumer, Record, TopicSettings};

    // Produce: typed content, receipts with offsets; NACKs (503) and connection failures are retried
    // up to 3 times with backoff; a 4xx is an error you can match on (ClientError::Rejected).
    let producer = Producer::new("http://127.0.0.1:8080")?.retries(5).auth_token(None);
    let receipt = producer.send("order.created", &order).await?;          // receipt.partition, receipt.offset
    producer.send_batch(&[Record::new("order.created", &order).with_key("c-1")]).await?;   // routed by key
    producer.send_to_partition("order.created", 3, None, &order).await?;

    // Topics: create or configure, show, delete.
    let admin = Admin::new("http://127.0.0.1:8080")?;
    admin.put_topic("order.created", &TopicSettings { partitions: Some(8), ..Default::default() }).await?;

    // Consume (push): an HTTP server the broker's dispatchers POST to; Ok = ACK, Err = NACK, content
    // that does not deserialize = NACK with the reason logged.
    Consumer::new()
        .handle("order.*", |m: Message<Order>| async move { ship(m.content).await })?
        .serve(tokio::net::TcpListener::bind("127.0.0.1:9000").await?, shutdown)
        .await?;

    // Consume (pull): a Stream from an offset, with long polling.
    let stream = PullConsumer::new("http://127.0.0.1:8080", "order.created")?.partition(3).from_offset(0).into_stream();

    // Exactly once (delivery.md, "Exactly-once consumers"): a redelivered message does not run the handler again.
    let store = DedupeStore::open("./orders.redb")?;
    Consumer::new().exactly_once(store.clone()).handle("order.*", handler)?;
    let member = GroupConsumer::new(broker, "shipping", "worker-1", "order.*")?.exactly_once(other_store);
    // end snippet
    Ok(())
}

#[rustfmt::skip]
async fn embedded(notice: Notice) -> anyhow::Result<()> {
    // snippet: embedded
    use mmmq::broker::Broker;
    use mmmq::config::ServeConfig;
    use mmmq_client::Message;

    let broker = Broker::open(ServeConfig::new("./data")).await?;   // also loads dispatchers.json
    broker.handle("mailer", "notify.*", |m: Message<Notice>| async move {
        send_mail(&m.content).await   // Ok = ACK; Err = NACK: retried 3 times, then __dlq.mailer
    }).await?;
    broker.produce_json("notify.weather", None, &notice).await?;   // durable when it returns
    // ...
    broker.shutdown().await;                                       // checkpoints persisted
    // end snippet
    Ok(())
}

#[rustfmt::skip]
async fn group() -> anyhow::Result<()> {
    use mmmq_client::GroupConsumer;
    // snippet: group
    let mut member = GroupConsumer::new("http://127.0.0.1:8080", "billing", "worker-1", "order.*")?;
    let mut stream = Box::pin(member.into_stream());   // auto-commits each batch before the next poll
    while let Some(envelope) = stream.next().await { bill(envelope?).await; }
    // end snippet
    Ok(())
}

fn main() {}
