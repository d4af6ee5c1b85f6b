//! Produces typed orders, one by one and as a batch, and prints the receipts.
//!
//! ```sh
//! cargo run -p mmmq-client --example producer -- http://127.0.0.1:8080
//! ```

use mmmq_client::{Producer, Record};
use serde::Serialize;

#[derive(Serialize)]
struct Order {
    id: u64,
    amount: f64,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let broker = std::env::args()
        .nth(1)
        .unwrap_or_else(|| mmmq_client::DEFAULT_BROKER.into());
    let producer = Producer::new(&broker)?.retries(5);
    let r = producer
        .send("order.created", &Order { id: 1, amount: 9.5 })
        .await?;
    println!("order 1 stored at {}/{}", r.topic, r.offset);
    let batch: Vec<Record<Order>> = (2..=4)
        .map(|id| {
            Record::new(
                "order.created",
                Order {
                    id,
                    amount: id as f64,
                },
            )
            .with_key(format!("c-{id}"))
        })
        .collect();
    for r in producer.send_batch(&batch).await? {
        println!("stored at {}/{}", r.topic, r.offset);
    }
    Ok(())
}
