//! `mmmq topic create|set|show|delete` (docs/operations.md, "Command-line client"), and the retention values
//! the command line takes.

use std::process::ExitCode;

use clap::Subcommand;

use super::{BrokerArg, client};

/// `mmmq topic …`.
#[derive(Subcommand)]
pub enum TopicCommand {
    /// Create a topic, or change the settings given (PUT /mmmq/topics/NAME).
    #[command(visible_alias = "set")]
    Create {
        /// The topic.
        name: String,
        /// Partitions (1–1024; a topic may grow, never shrink).
        #[arg(long)]
        partitions: Option<u32>,
        /// Delete messages older than this many milliseconds, or `forever`.
        #[arg(long, value_parser = parse_retention)]
        retention_ms: Option<Retention>,
        /// Per partition, delete the oldest segments while more than this is stored, or `none`.
        #[arg(long, value_parser = parse_retention)]
        retention_bytes: Option<Retention>,
        /// Never delete what a dispatcher has not delivered yet.
        #[arg(long)]
        keep_undelivered: Option<bool>,
        /// How long a produce id is remembered, in milliseconds.
        #[arg(long)]
        dedup_window_ms: Option<u64>,
        /// JSON instead of text.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        broker: BrokerArg,
    },
    /// A topic's configuration and partitions.
    Show {
        /// The topic.
        name: String,
        /// JSON instead of text.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        broker: BrokerArg,
    },
    /// Delete a topic: its messages, checkpoints and dispatcher workers.
    Delete {
        /// The topic.
        name: String,
        #[command(flatten)]
        broker: BrokerArg,
    },
}

/// Runs `mmmq topic …`.
pub fn run(what: TopicCommand) -> anyhow::Result<ExitCode> {
    let (name, action, json, broker) = match what {
        TopicCommand::Create {
            name,
            partitions,
            retention_ms,
            retention_bytes,
            keep_undelivered,
            dedup_window_ms,
            json,
            broker,
        } => {
            let settings = mmmq_client::TopicSettings {
                partitions,
                retention_ms: retention_ms.map(|r| r.0),
                retention_bytes: retention_bytes.map(|r| r.0),
                keep_undelivered,
                dedup_window_ms,
            };
            (name, client::TopicAction::Put(settings), json, broker)
        }
        TopicCommand::Show { name, json, broker } => {
            (name, client::TopicAction::Show, json, broker)
        }
        TopicCommand::Delete { name, broker } => (name, client::TopicAction::Delete, false, broker),
    };
    let rt = tokio::runtime::Runtime::new()?;
    rt.block_on(client::topic(
        &broker.conn(),
        &name,
        action,
        json,
        &mut std::io::stdout(),
    ))?;
    Ok(ExitCode::SUCCESS)
}

/// A retention limit (milliseconds or bytes), or none (`forever`, `none`).
#[derive(Debug, Clone, Copy)]
pub struct Retention(pub Option<u64>);

pub fn parse_retention(s: &str) -> Result<Retention, String> {
    match s {
        "forever" | "none" | "null" => Ok(Retention(None)),
        _ => s
            .parse::<u64>()
            .map(|ms| Retention(Some(ms)))
            .map_err(|_| format!("{s:?} is neither a number nor `forever`/`none`")),
    }
}
