//! The client commands of the binary (docs/operations.md, "Command-line client"): `produce`, `tail`, `topics`, `dispatchers`,
//! built on the `mmmq-client` crate.

use std::io::{BufRead, IsTerminal, Write};
use std::time::{Duration, Instant};

use mmmq_client::{
    Admin, ClientError, Producer, PullConsumer, Record, TargetStatus, TopicDetail, TopicSettings,
};
use serde_json::value::RawValue;

use super::table::retention;
pub use super::table::{print_json, table};

/// Why a client command failed.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// The broker said no, or could not be reached.
    #[error(transparent)]
    Client(#[from] ClientError),
    /// A line of input is not JSON.
    #[error("line {line}: not JSON: {error}")]
    BadLine {
        /// 1-based line number.
        line: usize,
        /// The parser's words.
        error: serde_json::Error,
    },
    /// Reading stdin or writing stdout failed.
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

/// Where the broker is and how to prove who we are.
#[derive(Debug, Clone)]
pub struct Conn {
    /// The broker's URL.
    pub url: String,
    /// Bearer token, if the broker wants one.
    pub token: Option<String>,
}

impl Conn {
    /// The admin client of this broker, with the token.
    pub fn admin(&self) -> Result<Admin, ClientError> {
        Ok(Admin::new(&self.url)?.auth_token(self.token.clone()))
    }
}

/// A receipt as `mmmq produce` prints it: `{"offset","partition","topic"}`, plus
/// `"duplicate":true` when the id had been produced before.
fn receipt(r: &mmmq_client::Receipt) -> serde_json::Value {
    let mut v = serde_json::json!({"topic": r.topic, "partition": r.partition, "offset": r.offset});
    if r.duplicate {
        v["duplicate"] = serde_json::Value::Bool(true);
    }
    v
}

/// Lines sent per batch request when producing from stdin.
const STDIN_BATCH: usize = 100;

/// `mmmq produce`: one message from `json`, or one per line of stdin. Prints one receipt per
/// message as a JSON line.
pub async fn produce(
    broker: &Conn,
    (topic, key, id): (&str, Option<&str>, Option<&str>),
    json: Option<&str>,
    out: &mut dyn Write,
) -> Result<u64, CliError> {
    let producer = Producer::new(&broker.url)?.auth_token(broker.token.clone());
    if let Some(json) = json {
        serde_json::from_str::<&RawValue>(json)
            .map_err(|error| CliError::BadLine { line: 1, error })?;
        let r = producer.send_raw_as(topic, key, id, json).await?;
        writeln!(out, "{}", receipt(&r))?;
        return Ok(1);
    }
    let stdin = std::io::stdin();
    let progress = std::io::stderr().is_terminal();
    let started = Instant::now();
    let mut last_report = Instant::now();
    let mut sent = 0u64;
    let mut batch: Vec<Record<Box<RawValue>>> = Vec::with_capacity(STDIN_BATCH);
    let mut lines = stdin.lock().lines().enumerate();
    loop {
        let next = lines.next();
        // A line that cannot be read or is not JSON stops the input, after the lines before it
        // are sent: what came before a bad line is stored, and its receipts printed.
        let mut stop: Option<CliError> = None;
        if let Some((i, line)) = &next {
            match line {
                Err(e) => stop = Some(std::io::Error::new(e.kind(), e.to_string()).into()),
                Ok(line) if line.trim().is_empty() => {}
                Ok(line) => match RawValue::from_string(line.trim().to_owned()) {
                    Err(error) => stop = Some(CliError::BadLine { line: i + 1, error }),
                    Ok(content) => {
                        let mut record = Record::new(topic, content);
                        record.key = key.map(str::to_owned);
                        // `--id P` with stdin: line N's id is `P-N`, so feeding the same input
                        // again stores nothing twice.
                        record.id = id.map(|p| format!("{p}-{}", i + 1));
                        batch.push(record);
                    }
                },
            }
        }
        let last = next.is_none() || stop.is_some();
        if batch.len() >= STDIN_BATCH || (last && !batch.is_empty()) {
            for r in producer.send_batch(&batch).await? {
                writeln!(out, "{}", receipt(&r))?;
            }
            sent += batch.len() as u64;
            batch.clear();
            if last_report.elapsed() > Duration::from_secs(1) {
                let rate = sent as f64 / started.elapsed().as_secs_f64();
                if progress {
                    eprint!("\rproduced {sent} messages ({rate:.0}/s)");
                } else {
                    eprintln!("produced {sent} messages ({rate:.0}/s)");
                }
                last_report = Instant::now();
            }
        }
        if let Some(e) = stop {
            return Err(e);
        }
        if next.is_none() {
            break;
        }
    }
    // The total, always (on stderr, so that stdout stays one receipt per line): a script sees at
    // once that its whole input went.
    eprintln!(
        "{}produced {sent} messages to {topic} in {:.1} s",
        if progress { "\r" } else { "" },
        started.elapsed().as_secs_f64()
    );
    Ok(sent)
}

/// `mmmq tail`: prints the topic's messages from `from` as JSON lines; with `follow`, waits for
/// more forever.
pub async fn tail(
    broker: &Conn,
    (topic, partition): (&str, u32),
    from: u64,
    follow: bool,
    out: &mut dyn Write,
) -> Result<(), CliError> {
    tail_with(
        broker,
        (topic, partition),
        (from, follow),
        out,
        envelope_line,
    )
    .await
}

/// An envelope as `tail` prints it: one JSON object.
pub fn envelope_line(m: &mmmq_client::Envelope) -> String {
    serde_json::to_string(m).expect("an envelope encodes")
}

/// A line of `__logs.<consumerId>` for people: `LEVEL topic/partition@offset (version): line`,
/// the plugin's text with its control characters escaped, as in the broker's log (a terminal
/// shows it, so a plugin must not be able to move the cursor or start a line there).
pub fn plugin_log_line(m: &mmmq_client::Envelope) -> String {
    let c: serde_json::Value = serde_json::from_str(m.content.get()).unwrap_or_default();
    let text = |v: &serde_json::Value| match v {
        serde_json::Value::String(s) => s.clone(),
        serde_json::Value::Null => "-".into(),
        other => other.to_string(),
    };
    format!(
        "{:<5} {}/{}@{} ({}): {}",
        text(&c["level"]).to_uppercase(),
        text(&c["topic"]),
        text(&c["partition"]),
        text(&c["offset"]),
        text(&c["version"]),
        mmmq::plugin::escape_controls(&text(&c["message"]))
    )
}

/// Prints a partition's messages from `from`, each as `format` says; with `follow`, keeps
/// waiting for more.
pub async fn tail_with(
    broker: &Conn,
    (topic, partition): (&str, u32),
    (from, follow): (u64, bool),
    out: &mut dyn Write,
    format: fn(&mmmq_client::Envelope) -> String,
) -> Result<(), CliError> {
    let wait = if follow {
        Duration::from_secs(30)
    } else {
        Duration::ZERO
    };
    let mut pull = PullConsumer::new(&broker.url, topic)?
        .auth_token(broker.token.clone())
        .partition(partition)
        .from_offset(from)
        .max(1000)
        .wait(wait);
    loop {
        let messages = pull.poll().await?;
        if messages.is_empty() && !follow {
            return Ok(());
        }
        for m in messages {
            writeln!(out, "{}", format(&m))?;
        }
        out.flush()?;
    }
}

/// `mmmq topics`.
pub async fn topics(broker: &Conn, json: bool, out: &mut dyn Write) -> Result<(), CliError> {
    let topics = broker.admin()?.topics().await?;
    if print_json(json, &topics, out)? {
        return Ok(());
    }
    let rows: Vec<Vec<String>> = topics
        .iter()
        .map(|t| {
            vec![
                t.name.clone(),
                t.partition_count.to_string(),
                t.first_offset.to_string(),
                t.next_offset.to_string(),
                t.segments.to_string(),
                t.bytes.to_string(),
                retention(t.retention_ms, t.retention_bytes),
            ]
        })
        .collect();
    table(
        &[
            "TOPIC",
            "PARTITIONS",
            "FIRST OFFSET",
            "NEXT OFFSET",
            "SEGMENTS",
            "BYTES",
            "RETENTION",
        ],
        &rows,
        out,
    )?;
    Ok(())
}

/// What `mmmq topic` does.
#[derive(Debug)]
pub enum TopicAction {
    /// Create the topic, or change the settings named.
    Put(TopicSettings),
    /// Print its configuration and partitions.
    Show,
    /// Delete it.
    Delete,
}

/// `mmmq topic create|show|delete NAME`.
pub async fn topic(
    broker: &Conn,
    name: &str,
    action: TopicAction,
    json: bool,
    out: &mut dyn Write,
) -> Result<(), CliError> {
    let admin = broker.admin()?;
    let detail = match action {
        TopicAction::Put(settings) => admin.put_topic(name, &settings).await?,
        TopicAction::Show => admin.topic(name).await?,
        TopicAction::Delete => {
            admin.delete_topic(name).await?;
            writeln!(out, "deleted {name}")?;
            return Ok(());
        }
    };
    if print_json(json, &detail, out)? {
        return Ok(());
    }
    show_topic(&detail, out)
}

fn show_topic(d: &TopicDetail, out: &mut dyn Write) -> Result<(), CliError> {
    let c = &d.config;
    writeln!(out, "topic {}", d.name)?;
    writeln!(out, "  partitions       {}", c.partitions)?;
    writeln!(
        out,
        "  retention        {}",
        retention(c.retention_ms, None)
    )?;
    let bytes = c
        .retention_bytes
        .map_or("none".to_owned(), |b| format!("{b} B"));
    writeln!(out, "  retention bytes  {bytes} (per partition)")?;
    writeln!(out, "  keep undelivered {}", c.keep_undelivered)?;
    writeln!(out, "  dedup window     {} ms", c.dedup_window_ms)?;
    let rows: Vec<Vec<String>> = d
        .partitions
        .iter()
        .map(|p| {
            vec![
                p.partition.to_string(),
                p.first_offset.to_string(),
                p.next_offset.to_string(),
                p.segments.to_string(),
                p.bytes.to_string(),
            ]
        })
        .collect();
    table(
        &[
            "PARTITION",
            "FIRST OFFSET",
            "NEXT OFFSET",
            "SEGMENTS",
            "BYTES",
        ],
        &rows,
        out,
    )?;
    Ok(())
}

/// `mmmq reload`: what changed, one line per kind of change that happened.
pub async fn reload(broker: &Conn, json: bool, out: &mut dyn Write) -> Result<(), CliError> {
    let report = broker.admin()?.reload().await?;
    if print_json(json, &report, out)? {
        return Ok(());
    }
    let kinds = [
        ("added", &report.added),
        ("removed", &report.removed),
        ("changed", &report.changed),
        ("reloaded", &report.reloaded),
        ("reload errors", &report.reload_errors),
        ("awaiting a first deploy", &report.awaiting_deploy),
        ("unchanged", &report.unchanged),
    ];
    if kinds.iter().all(|(_, ids)| ids.is_empty()) {
        // An empty answer would leave the user guessing whether anything was read.
        writeln!(out, "no dispatchers configured")?;
    }
    for (kind, ids) in kinds.iter().filter(|(_, ids)| !ids.is_empty()) {
        writeln!(out, "{kind}: {}", ids.join(", "))?;
    }
    Ok(())
}

/// `mmmq groups`.
pub async fn groups(broker: &Conn, json: bool, out: &mut dyn Write) -> Result<(), CliError> {
    let all = broker.admin()?.groups().await?;
    if print_json(json, &all, out)? {
        return Ok(());
    }
    let rows: Vec<Vec<String>> = all
        .iter()
        .map(|g| {
            let members: Vec<&str> = g.members.iter().map(|m| m.member.as_str()).collect();
            vec![
                g.group.clone(),
                g.pattern.clone(),
                if members.is_empty() {
                    "-".to_owned()
                } else {
                    members.join(",")
                },
                g.partitions.len().to_string(),
                g.partitions.iter().map(|p| p.lag).sum::<u64>().to_string(),
            ]
        })
        .collect();
    table(
        &["GROUP", "PATTERN", "MEMBERS", "PARTITIONS", "LAG"],
        &rows,
        out,
    )?;
    Ok(())
}

/// `mmmq dispatchers`.
pub async fn dispatchers(broker: &Conn, json: bool, out: &mut dyn Write) -> Result<(), CliError> {
    let all = broker.admin()?.dispatchers().await?;
    if print_json(json, &all, out)? {
        return Ok(());
    }
    let now = mmmq_core::now_ms();
    let rows: Vec<Vec<String>> = all
        .iter()
        .map(|d| {
            let target = match &d.target {
                TargetStatus::Host { url } => url.clone(),
                TargetStatus::Hosts { hosts } => hosts
                    .iter()
                    .map(|h| {
                        let state = if h.healthy { "" } else { " (resting)" };
                        format!("{}{state}", h.url)
                    })
                    .collect::<Vec<_>>()
                    .join(", "),
                TargetStatus::InProcess => "in-process handler".to_owned(),
                TargetStatus::Plugin {
                    path,
                    version,
                    load_error,
                    emit_error,
                    awaiting_deploy,
                    ..
                } => {
                    let serving = match (version, load_error) {
                        (Some(v), None) => format!("{path} @{v}"),
                        (Some(v), Some(_)) => format!("{path} @{v} (newer file failed)"),
                        (None, _) if *awaiting_deploy => {
                            format!("{path} (awaiting a first deploy)")
                        }
                        (None, _) => format!("{path} (not loaded)"),
                    };
                    match emit_error {
                        Some(_) => format!("{serving} (emits not stored, retrying)"),
                        None => serving,
                    }
                }
                TargetStatus::Other => "?".to_owned(),
            };
            vec![
                d.consumer_id.clone(),
                d.pattern.clone(),
                target,
                d.delivered.to_string(),
                d.nacked.to_string(),
                d.dead_lettered.to_string(),
                d.dropped.to_string(),
                d.lag.to_string(),
                // The first line: a table row is one line (`--json` has the whole reason).
                super::table::last_error(
                    d.last_error.as_deref(),
                    d.last_error_at,
                    d.last_error_resolved_at,
                    now,
                ),
            ]
        })
        .collect();
    table(
        &[
            "CONSUMER",
            "PATTERN",
            "TARGET",
            "DELIVERED",
            "NACKED",
            "DEAD-LETTERED",
            "DROPPED",
            "LAG",
            "LAST ERROR",
        ],
        &rows,
        out,
    )?;
    Ok(())
}
