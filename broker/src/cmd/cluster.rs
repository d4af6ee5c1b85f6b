//! `mmmq cluster …` (docs/cluster.md, "Status" and "Membership"): a cluster's brokers and
//! partitions as any of its brokers sees them, and the commands that add or remove a broker or
//! move a partition's replicas.

use std::io::Write;
use std::process::ExitCode;

use clap::Subcommand;
use mmmq::config::cluster::ClusterSettings;
use mmmq_core::cluster::ClusterView;

use super::BrokerArg;
use super::client::CliError;
use super::table::{print_json, table};

/// `serve`'s cluster flags (contract §13).
#[derive(clap::Args)]
pub struct ClusterFlags {
    /// This broker's id in a cluster (1, 2, …; never reused). With --peers the broker is a
    /// cluster member; without both it is a single broker.
    #[arg(long, env = "MMMQ_NODE_ID", requires = "peers")]
    node_id: Option<u64>,
    /// Every broker of the cluster, this one too, by id and HTTP address:
    /// `1=HOST:PORT,2=HOST:PORT,3=HOST:PORT`.
    #[arg(long, env = "MMMQ_PEERS", requires = "node_id")]
    peers: Option<String>,
    /// Let tests cut or slow this broker's Raft traffic and make its disk refuse writes (PUT
    /// /mmmq/internal/faults); never in production.
    #[arg(long, hide = true)]
    fault_injection: bool,
    /// A file whose first line is the members' secret (make one with `mmmq cluster secret`;
    /// give every broker the same). Without it the cluster draws one when it forms, and a
    /// broker takes any internal request until its metadata brings it.
    #[arg(long, env = "MMMQ_CLUSTER_SECRET_FILE", requires = "node_id")]
    cluster_secret_file: Option<std::path::PathBuf>,
}

impl ClusterFlags {
    /// The settings these flags ask for, checked; `listen` must be the port `--peers` gives
    /// this broker (its peers reach it there).
    pub fn settings(&self, listen: &str) -> anyhow::Result<Option<ClusterSettings>> {
        let (Some(id), Some(peers)) = (self.node_id, &self.peers) else {
            return Ok(None);
        };
        let mut settings = ClusterSettings::parse(id, peers).map_err(anyhow::Error::msg)?;
        settings.fault_injection = self.fault_injection;
        if let Some(path) = &self.cluster_secret_file {
            settings.secret =
                Some(mmmq::cluster::secret::read_secret_file(path).map_err(anyhow::Error::msg)?);
        }
        let port = |a: &str| a.rsplit_once(':').map(|(_, p)| p.to_owned());
        if port(listen) != port(settings.addr()) {
            anyhow::bail!(
                "--listen {listen} is not the address --peers gives broker {id} ({}): its peers \
                 would not reach it",
                settings.addr()
            );
        }
        Ok(Some(settings))
    }
}

/// `mmmq cluster …`.
#[derive(Subcommand)]
pub enum ClusterCommand {
    /// Prints a new members' secret (256 random bits, hex) for `serve --cluster-secret-file`.
    Secret,
    /// The brokers (alive or not), the metadata leader, and per partition its leader, replicas,
    /// term and lag (GET /mmmq/cluster).
    Status {
        /// JSON instead of text.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        broker: BrokerArg,
    },
    /// Adds broker ID, already started at ADDR with `--node-id ID --peers <the cluster's
    /// brokers and itself>`: it joins the metadata group, and new topics place replicas on it
    /// (POST /mmmq/cluster/brokers).
    AddBroker {
        /// The new broker's id: never one removed before, higher than the cluster's lowest.
        id: u64,
        /// Its HTTP address, HOST:PORT, as its own --peers entry gives it.
        addr: String,
        #[command(flatten)]
        broker: BrokerArg,
    },
    /// Removes broker ID: each of its replicas moves to another broker first, then it leaves
    /// the cluster and its id is never used again (DELETE /mmmq/cluster/brokers/ID).
    RemoveBroker {
        /// The broker's id.
        id: u64,
        #[command(flatten)]
        broker: BrokerArg,
    },
    /// Moves a partition's replicas while it takes produces (PUT
    /// /mmmq/cluster/partitions/TOPIC/PARTITION).
    Reassign {
        /// The topic.
        topic: String,
        /// The partition.
        partition: u32,
        /// The new replicas, preferred leader first, as many as the topic's replicationFactor:
        /// `1,2,4`.
        #[arg(long, value_delimiter = ',', required = true)]
        replicas: Vec<u64>,
        #[command(flatten)]
        broker: BrokerArg,
    },
}

/// How long a membership command may take: new replicas catch up first.
const MEMBERSHIP_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(120);

/// Runs `mmmq cluster …`.
pub fn run(what: ClusterCommand) -> anyhow::Result<ExitCode> {
    let rt = tokio::runtime::Runtime::new()?;
    let admin = |broker: &BrokerArg| -> Result<mmmq_client::Admin, mmmq_client::ClientError> {
        broker.conn().admin()?.timeout(MEMBERSHIP_TIMEOUT)
    };
    let out = &mut std::io::stdout();
    match what {
        ClusterCommand::Secret => {
            writeln!(out, "{}", mmmq::cluster::identity::new_secret()?)?;
        }
        ClusterCommand::Status { json, broker } => {
            let view = rt.block_on(async { broker.conn().admin()?.cluster().await })?;
            status(&view, json, out)?;
        }
        ClusterCommand::AddBroker { id, addr, broker } => {
            let view = rt.block_on(async { admin(&broker)?.add_broker(id, &addr).await })?;
            writeln!(out, "broker {id} added at {addr}")?;
            status(&view, false, out)?;
        }
        ClusterCommand::RemoveBroker { id, broker } => {
            let view = rt.block_on(async { admin(&broker)?.remove_broker(id).await })?;
            writeln!(out, "broker {id} removed; it can be stopped")?;
            status(&view, false, out)?;
        }
        ClusterCommand::Reassign {
            topic,
            partition,
            replicas,
            broker,
        } => {
            let view = rt
                .block_on(async { admin(&broker)?.reassign(&topic, partition, &replicas).await })?;
            writeln!(out, "{topic}/{partition} moved to {replicas:?}")?;
            status(&view, false, out)?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Prints a [`ClusterView`]: the brokers, then the partitions, lagging ones first.
pub fn status(view: &ClusterView, json: bool, out: &mut dyn Write) -> Result<(), CliError> {
    if print_json(json, view, out)? {
        return Ok(());
    }
    if !view.clustered {
        writeln!(out, "a single broker (not a cluster member)")?;
        return Ok(());
    }
    let id = view.cluster_id.as_deref().unwrap_or("not known yet");
    writeln!(out, "cluster id: {id}")?;
    let meta = view.meta.clone().unwrap_or_default();
    let leader = meta.leader.map_or("none".to_owned(), |l| l.to_string());
    writeln!(out, "metadata leader: {leader} (term {})", meta.term)?;
    let rows: Vec<Vec<String>> = view
        .brokers
        .iter()
        .map(|b| {
            let leads = view
                .partitions
                .iter()
                .filter(|p| p.leader == Some(b.id))
                .count();
            let holds = view
                .partitions
                .iter()
                .filter(|p| p.replicas.contains(&b.id))
                .count();
            vec![
                b.id.to_string(),
                b.addr.clone(),
                match b.alive {
                    Some(true) => "yes",
                    Some(false) => "NO",
                    None => "?",
                }
                .to_owned(),
                leads.to_string(),
                holds.to_string(),
            ]
        })
        .collect();
    table(
        &["BROKER", "ADDRESS", "ALIVE", "LEADS", "REPLICAS"],
        &rows,
        out,
    )?;
    let max_lag = |p: &mmmq_core::cluster::PartitionView| {
        p.lag
            .as_ref()
            .map(|l| l.values().map(|v| v.unwrap_or(u64::MAX)).max().unwrap_or(0))
    };
    let mut partitions: Vec<_> = view.partitions.iter().collect();
    partitions.sort_by_key(|p| std::cmp::Reverse(max_lag(p).unwrap_or(0)));
    let rows: Vec<Vec<String>> = partitions
        .iter()
        .map(|p| {
            vec![
                p.topic.clone(),
                p.partition.to_string(),
                p.leader.map_or("none".to_owned(), |l| l.to_string()),
                p.replicas
                    .iter()
                    .map(u64::to_string)
                    .collect::<Vec<_>>()
                    .join(","),
                p.term.map_or("-".to_owned(), |t| t.to_string()),
                match max_lag(p) {
                    None => "?".to_owned(),
                    Some(u64::MAX) => "no ack yet".to_owned(),
                    Some(l) => l.to_string(),
                },
            ]
        })
        .collect();
    writeln!(out)?;
    table(
        &[
            "TOPIC",
            "PARTITION",
            "LEADER",
            "REPLICAS",
            "TERM",
            "MAX LAG",
        ],
        &rows,
        out,
    )?;
    Ok(())
}
