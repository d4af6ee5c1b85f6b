//! Follows a topic from an offset with long polling and prints each message.
//!
//! ```sh
//! cargo run -p mmmq-client --example pull -- http://127.0.0.1:8080 order.created 0
//! ```

use futures_util::StreamExt;
use mmmq_client::PullConsumer;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let broker = args
        .next()
        .unwrap_or_else(|| mmmq_client::DEFAULT_BROKER.into());
    let topic = args.next().unwrap_or_else(|| "order.created".into());
    let from: u64 = args.next().map(|s| s.parse()).transpose()?.unwrap_or(0);
    let stream = PullConsumer::new(&broker, &topic)?
        .from_offset(from)
        .into_stream();
    futures_util::pin_mut!(stream);
    while let Some(item) = stream.next().await {
        match item {
            Ok(m) => println!("{} {} {}", m.topic, m.offset, m.content),
            Err(e) => eprintln!("{e}"),
        }
    }
    Ok(())
}
