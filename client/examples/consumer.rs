//! A consumer service: prints every message it receives as a JSON line, and NACKs messages whose
//! content has `"reject": true`.
//!
//! ```sh
//! cargo run -p mmmq-client --example consumer -- 127.0.0.1:9000 'order.**'
//! ```
//! then point a dispatcher at it: `"host": {"protocol": "HTTP", "address": "127.0.0.1", "port": 9000}`.

use std::io::Write;

use mmmq_client::{Consumer, Message};
use serde_json::Value;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let listen = args.next().unwrap_or_else(|| "127.0.0.1:9000".into());
    let pattern = args.next().unwrap_or_else(|| "**".into());
    let consumer = Consumer::new().handle(&pattern, |m: Message<Value>| async move {
        if m.content.get("reject") == Some(&Value::Bool(true)) {
            return Err(format!("offset {} asked to be rejected", m.offset));
        }
        let line = serde_json::json!({"topic": m.topic, "offset": m.offset, "key": m.key, "content": m.content});
        let mut out = std::io::stdout().lock();
        writeln!(out, "{line}").map_err(|e| e.to_string())?;
        out.flush().map_err(|e| e.to_string())
    })?;
    let listener = tokio::net::TcpListener::bind(&listen).await?;
    eprintln!("consumer listening on {}", listener.local_addr()?);
    consumer
        .serve(listener, async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
    Ok(())
}
