//! `mmmq dlq list|redrive CONSUMER` (docs/delivery.md, "Dead-letter redrive"): a dispatcher's dead letters,
//! and delivering them again to it.

use std::io::Write;
use std::process::ExitCode;
use std::time::Duration;

use clap::Subcommand;
use mmmq_client::{ClientError, PullConsumer, RedriveNext, RedriveStatus};

use super::table::{first_line, last_error};
use super::{BrokerArg, client};

/// `mmmq dlq …`.
#[derive(Subcommand)]
pub enum DlqCommand {
    /// The dead letters of a dispatcher (`__dlq.CONSUMER`): where each came from, its attempts,
    /// how many redrives of it failed before, whether a redrive took it, and the first line of
    /// the reason.
    List {
        /// The dispatcher's consumerId.
        consumer: String,
        /// First offset of the dead-letter topic.
        #[arg(long, default_value_t = 0)]
        from: u64,
        /// Print at most this many.
        #[arg(long, default_value_t = 1000)]
        max: usize,
        /// One JSON envelope per line instead of a table (the whole reason and history).
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        broker: BrokerArg,
    },
    /// Deliver a dispatcher's dead letters again to its own target, in order.
    Redrive {
        /// The dispatcher's consumerId.
        consumer: String,
        /// First offset (default: where the last redrive stopped).
        #[arg(long)]
        from: Option<u64>,
        /// End offset, exclusive (default: the end).
        #[arg(long)]
        to: Option<u64>,
        /// Wait until it is done, printing its progress.
        #[arg(long)]
        wait: bool,
        #[command(flatten)]
        broker: BrokerArg,
    },
}

/// Runs `mmmq dlq …`.
pub fn run(what: DlqCommand) -> anyhow::Result<ExitCode> {
    let rt = tokio::runtime::Runtime::new()?;
    let out = &mut std::io::stdout();
    match what {
        DlqCommand::List {
            consumer,
            from,
            max,
            json,
            broker,
        } => rt.block_on(list(&broker.conn(), &consumer, from, max, json, out))?,
        DlqCommand::Redrive {
            consumer,
            from,
            to,
            wait,
            broker,
        } => rt.block_on(redrive(&broker.conn(), &consumer, (from, to), wait, out))?,
    }
    Ok(ExitCode::SUCCESS)
}

async fn list(
    broker: &client::Conn,
    consumer: &str,
    from: u64,
    max: usize,
    json: bool,
    out: &mut dyn Write,
) -> Result<(), client::CliError> {
    let topic = format!("__dlq.{consumer}");
    let admin = broker.admin()?;
    let partitions = match admin.topic(&topic).await {
        Ok(detail) => detail.partitions.len() as u32,
        Err(ClientError::NoSuchTopic(_)) => {
            writeln!(out, "no dead letters for {consumer:?}")?;
            return Ok(());
        }
        Err(e) => return Err(e.into()),
    };
    // Where the next redrive starts: the dead letters below it were redriven. Unknown when the
    // dispatcher is not running (the broker reports only those).
    let redrive_next: Option<Vec<RedriveNext>> = if json {
        None
    } else {
        admin
            .dispatchers()
            .await?
            .into_iter()
            .find(|d| d.consumer_id == consumer)
            .map(|d| d.redrive_next)
    };
    let mut rows = Vec::new();
    for partition in 0..partitions {
        let mut pull = PullConsumer::new(&broker.url, &topic)?
            .auth_token(broker.token.clone())
            .partition(partition)
            .from_offset(from)
            .max(max.min(1000))
            .wait(Duration::ZERO);
        while rows.len() < max {
            let page = pull.poll().await?;
            if page.is_empty() {
                break;
            }
            for e in page.into_iter().take(max - rows.len()) {
                if json {
                    writeln!(out, "{}", serde_json::to_string(&e).expect("encodes"))?;
                }
                rows.push(row(&e, redrive_next.as_deref()));
            }
        }
    }
    if !json {
        client::table(
            &[
                "OFFSET",
                "TOPIC",
                "PARTITION",
                "FROM OFFSET",
                "ATTEMPTS",
                "FAILED REDRIVES",
                "REDRIVEN",
                "REASON",
            ],
            &rows,
            out,
        )?;
    }
    Ok(())
}

/// One dead letter as a table row. FAILED REDRIVES: the redrives of this message that failed
/// before it was dead-lettered here (the entries of its `history`); REDRIVEN: whether a redrive
/// has taken this dead letter (`yes`: the next `mmmq dlq redrive` without `--from` leaves it;
/// `?`: the dispatcher is not running, so the broker does not say).
fn row(e: &mmmq_client::Envelope, redrive_next: Option<&[RedriveNext]>) -> Vec<String> {
    let c: serde_json::Value = serde_json::from_str(e.content.get()).unwrap_or_default();
    let field = |v: &serde_json::Value| match v {
        serde_json::Value::String(s) => s.clone(),
        serde_json::Value::Null => "-".into(),
        other => other.to_string(),
    };
    let failed_redrives = c["history"].as_array().map_or(0, Vec::len);
    let redriven = match redrive_next {
        None => "?",
        // A partition the broker did not report (an older broker, a checkpoint it could not
        // read) is unknown, not "no".
        Some(next) => match next.iter().find(|n| n.partition == e.partition) {
            None => "?",
            Some(n) if e.offset < n.next => "yes",
            Some(_) => "no",
        },
    };
    vec![
        format!("{}/{}", e.partition, e.offset),
        field(&c["envelope"]["topic"]),
        field(&c["envelope"]["partition"]),
        field(&c["envelope"]["offset"]),
        field(&c["attempts"]),
        failed_redrives.to_string(),
        redriven.to_owned(),
        // A table row is one line: the whole reason is in `--json`.
        first_line(&field(&c["reason"])),
    ]
}

async fn redrive(
    broker: &client::Conn,
    consumer: &str,
    (from, to): (Option<u64>, Option<u64>),
    wait: bool,
    out: &mut dyn Write,
) -> Result<(), client::CliError> {
    let admin = broker.admin()?;
    let mut status = admin.redrive(consumer, from, to).await?;
    print_progress(&status, out)?;
    while wait && status.running {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let all = admin.dispatchers().await?;
        let Some(s) = all
            .into_iter()
            .find(|d| d.consumer_id == consumer)
            .and_then(|d| d.redrive)
        else {
            break;
        };
        status = s;
        print_progress(&status, out)?;
    }
    Ok(())
}

fn print_progress(s: &RedriveStatus, out: &mut dyn Write) -> std::io::Result<()> {
    let last_error = match &s.last_error {
        None => String::new(),
        Some(e) => format!(
            "; last error {}",
            last_error(
                Some(e),
                s.last_error_at,
                s.last_error_resolved_at,
                mmmq_core::now_ms()
            )
        ),
    };
    writeln!(
        out,
        "{}: {} redriven ({} delivered, {} dead-lettered again, {} dropped), {} to go{last_error}",
        if s.running { "redriving" } else { "done" },
        s.redriven,
        s.delivered,
        s.dead_lettered,
        s.dropped,
        s.remaining,
    )
}
