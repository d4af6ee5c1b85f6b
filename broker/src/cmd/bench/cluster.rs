//! `mmmq bench cluster`: brokers of this very binary on 127.0.0.1, each its own process and root
//! dir (docs/benchmarks.md, "A cluster"): replicated produce
//! next to a single broker measured in the same run, failover after SIGKILLs of a partition's
//! leader, and what many idle partition groups cost.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::http::http_load;
use super::{Latencies, RunArgs, scratch_dir};

/// Parameters of `mmmq bench cluster`.
#[derive(Debug, Clone, clap::Args)]
pub struct ClusterBench {
    /// Where the root dirs go (on the disk being measured), how long each produce load runs,
    /// and how big a message is.
    #[command(flatten)]
    pub run: RunArgs,
    /// Which parts run: `produce`, `failover`, `idle`, `delivery`.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "produce,failover,idle,delivery"
    )]
    pub parts: Vec<String>,
    /// Brokers of the cluster.
    #[arg(long, default_value_t = 3)]
    pub brokers: u64,
    /// Producer counts of the produce part.
    #[arg(long, value_delimiter = ',', default_value = "1,64")]
    pub producers: Vec<usize>,
    /// SIGKILLs of the failover part.
    #[arg(long, default_value_t = 100)]
    pub kills: usize,
    /// Partitions (each replicated on every broker) of the idle part.
    #[arg(long, default_value_t = 300)]
    pub idle_partitions: u32,
    /// How long the idle part measures.
    #[arg(long, value_parser = super::parse_seconds, default_value = "10")]
    pub idle_seconds: Duration,
}

/// Runs the parts asked for.
pub async fn run(cfg: ClusterBench, out: &mut (dyn Write + Send)) -> anyhow::Result<()> {
    let scratch = scratch_dir(&cfg.run.dir)?;
    let http = reqwest::Client::new();
    for part in &cfg.parts {
        let dir = scratch.path().join(part);
        let line = match part.as_str() {
            "produce" => produce(&cfg, &dir, &http).await?,
            "failover" => failover(&cfg, &dir, &http).await?,
            "idle" => idle(&cfg, &dir, &http).await?,
            "delivery" => super::cluster_delivery::delivery(&cfg, &dir, &http).await?,
            other => anyhow::bail!("no part {other:?}: produce, failover, idle or delivery"),
        };
        writeln!(out, "{line}")?;
    }
    Ok(())
}

/// Brokers as child processes.
pub(super) struct Nodes {
    exe: PathBuf,
    roots: Vec<PathBuf>,
    ports: Vec<u16>,
    /// Cluster flags, or none for a single broker.
    clustered: bool,
    children: Vec<Option<Child>>,
}

impl Drop for Nodes {
    fn drop(&mut self) {
        for c in self.children.iter_mut().flatten() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Nodes {
    /// Starts `n` brokers (a cluster, or one single broker when `clustered` is false) and waits
    /// until each answers `/healthz`.
    pub(super) async fn start(
        dir: &Path,
        n: u64,
        clustered: bool,
        http: &reqwest::Client,
    ) -> anyhow::Result<Self> {
        let mut ports = Vec::new();
        for _ in 0..n {
            ports.push(
                std::net::TcpListener::bind("127.0.0.1:0")?
                    .local_addr()?
                    .port(),
            );
        }
        let mut nodes = Self {
            exe: std::env::current_exe()?,
            roots: (1..=n).map(|i| dir.join(i.to_string())).collect(),
            ports,
            clustered,
            children: Vec::new(),
        };
        for id in 1..=n {
            let child = nodes.spawn(id)?;
            nodes.children.push(Some(child));
        }
        for id in 1..=n {
            nodes.healthy(id, http).await?;
        }
        Ok(nodes)
    }

    pub(super) fn root(&self, id: u64) -> &Path {
        &self.roots[(id - 1) as usize]
    }

    pub(super) fn url(&self, id: u64) -> String {
        format!("http://127.0.0.1:{}", self.ports[(id - 1) as usize])
    }

    pub(super) fn urls(&self) -> Vec<String> {
        (1..=self.ports.len() as u64)
            .map(|id| self.url(id))
            .collect()
    }

    fn spawn(&self, id: u64) -> anyhow::Result<Child> {
        let i = (id - 1) as usize;
        let mut cmd = Command::new(&self.exe);
        cmd.args(["serve", "--root-dir"])
            .arg(&self.roots[i])
            .args(["--listen", &format!("127.0.0.1:{}", self.ports[i])])
            .env("RUST_LOG", "error")
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        if self.clustered {
            let peers: Vec<String> = self
                .ports
                .iter()
                .enumerate()
                .map(|(i, p)| format!("{}=127.0.0.1:{p}", i + 1))
                .collect();
            cmd.args(["--node-id", &id.to_string(), "--peers", &peers.join(",")]);
        }
        Ok(cmd.spawn()?)
    }

    async fn healthy(&self, id: u64, http: &reqwest::Client) -> anyhow::Result<()> {
        let start = Instant::now();
        while !http
            .get(format!("{}/healthz", self.url(id)))
            .send()
            .await
            .is_ok_and(|r| r.status() == 200)
        {
            anyhow::ensure!(
                start.elapsed() < Duration::from_secs(60),
                "broker {id} never healthy"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        Ok(())
    }

    fn pid(&self, id: u64) -> Option<u32> {
        self.children[(id - 1) as usize].as_ref().map(Child::id)
    }

    pub(super) fn kill(&mut self, id: u64) {
        if let Some(mut c) = self.children[(id - 1) as usize].take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    async fn restart(&mut self, id: u64, http: &reqwest::Client) -> anyhow::Result<()> {
        let child = self.spawn(id)?;
        self.children[(id - 1) as usize] = Some(child);
        self.healthy(id, http).await
    }

    fn running(&self) -> impl Iterator<Item = u64> + '_ {
        (1..=self.children.len() as u64).filter(|id| self.children[(*id - 1) as usize].is_some())
    }

    /// Waits until a running broker's `GET /mmmq/cluster` says `ready` (every broker alive,
    /// ...); answers that view.
    async fn wait_view(
        &self,
        http: &reqwest::Client,
        what: &str,
        ready: impl Fn(&Value) -> bool,
    ) -> anyhow::Result<Value> {
        let start = Instant::now();
        loop {
            for id in self.running() {
                let view = async {
                    http.get(format!("{}/mmmq/cluster", self.url(id)))
                        .send()
                        .await?
                        .json::<Value>()
                        .await
                };
                if let Ok(v) = view.await
                    && ready(&v)
                {
                    return Ok(v);
                }
            }
            anyhow::ensure!(
                start.elapsed() < Duration::from_secs(120),
                "the cluster never had {what}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Waits until every broker is alive and every partition has a leader that reports each
    /// replica 0 entries behind.
    pub(super) async fn settled(&self, http: &reqwest::Client) -> anyhow::Result<Value> {
        let n = self.children.len();
        self.wait_view(http, "every partition led and caught up", |v| {
            let alive = v["brokers"]
                .as_array()
                .map_or(0, |b| b.iter().filter(|b| b["alive"] == true).count());
            alive == n
                && v["partitions"].as_array().is_some_and(|ps| {
                    ps.iter().all(|p| {
                        p["leader"].is_u64()
                            && p["lag"].as_object().is_some_and(|l| {
                                l.len() == p["replicas"].as_array().map_or(0, Vec::len)
                                    && l.values().all(|x| x.as_u64() == Some(0))
                            })
                    })
                })
        })
        .await
    }

    pub(super) async fn put_topic(
        &self,
        http: &reqwest::Client,
        topic: &str,
        body: Value,
    ) -> anyhow::Result<()> {
        let r = http
            .put(format!("{}/mmmq/topics/{topic}", self.url(1)))
            .json(&body)
            .send()
            .await?;
        anyhow::ensure!(r.status() == 200, "PUT {topic}: {}", r.text().await?);
        Ok(())
    }
}

/// Single-message produce of `topic` by `p` producers over `bases`.
pub(super) async fn http_load_owned(
    bases: Vec<String>,
    p: usize,
    duration: Duration,
    clock: Instant,
    topic: String,
    pad: String,
) -> anyhow::Result<super::http::LoadResult> {
    http_load(&bases, p, duration, clock, (1, false), &topic, &pad).await
}

pub(super) fn leader_of(view: &Value, topic: &str) -> Option<u64> {
    view["partitions"]
        .as_array()?
        .iter()
        .find(|p| p["topic"] == topic && p["partition"] == 0)?["leader"]
        .as_u64()
}

/// Durable produce of 1 KiB messages into one partition: a single broker, then the cluster
/// through every broker (producers spread over them) and through the leader alone.
async fn produce(cfg: &ClusterBench, dir: &Path, http: &reqwest::Client) -> anyhow::Result<Value> {
    let pad = "x".repeat(cfg.run.message_bytes);
    let clock = Instant::now();
    let load = |bases: Vec<String>, p: usize, topic: String| {
        http_load_owned(bases, p, cfg.run.duration, clock, topic, pad.clone())
    };
    let mut rows = Vec::new();
    let single = Nodes::start(&dir.join("single"), 1, false, http).await?;
    let mut single_rows = Vec::new();
    for &p in &cfg.producers {
        let topic = format!("single.p{p}");
        single
            .put_topic(http, &topic, json!({"partitions": 1}))
            .await?;
        let pids = [single.pid(1).unwrap_or(0), std::process::id()];
        let (r, cpu) = cpu_per_message(&pids, load(single.urls(), p, topic.clone())).await?;
        single_rows.push((p, r.rate(), r.p99_us, cpu));
    }
    drop(single);
    let cluster = Nodes::start(&dir.join("cluster"), cfg.brokers, true, http).await?;
    for (i, &p) in cfg.producers.iter().enumerate() {
        let topic = format!("cluster.p{p}");
        cluster
            .put_topic(http, &topic, json!({"partitions": 1}))
            .await?;
        let view = cluster.settled(http).await?;
        let leader = leader_of(&view, &topic).ok_or_else(|| anyhow::anyhow!("no leader"))?;
        let spread = load(cluster.urls(), p, topic.clone()).await?;
        // The leader, its followers, then this process (the producers).
        let mut pids: Vec<u32> = std::iter::once(leader)
            .chain((1..=cfg.brokers).filter(|b| *b != leader))
            .map(|b| cluster.pid(b).unwrap_or(0))
            .collect();
        pids.push(std::process::id());
        let (direct, cluster_cpu) =
            cpu_per_message(&pids, load(vec![cluster.url(leader)], p, topic.clone())).await?;
        let (_, single_rate, single_p99, ref single_cpu) = single_rows[i];
        rows.push(json!({
            "producers": p,
            "single_msg_s": single_rate, "single_p99_us": single_p99,
            "cluster_any_broker_msg_s": spread.rate(), "cluster_any_broker_p99_us": spread.p99_us,
            "cluster_via_leader_msg_s": direct.rate(), "cluster_via_leader_p99_us": direct.p99_us,
            "cluster_any_broker_p50_us": spread.p50_us, "cluster_via_leader_p50_us": direct.p50_us,
            "ratio_any_broker": spread.rate() / single_rate,
            "ratio_via_leader": direct.rate() / single_rate,
            "cpu_us_per_msg": {
                "single_broker": single_cpu[0], "single_producers": single_cpu[1],
                "cluster_via_leader_leader": cluster_cpu[0],
                "cluster_via_leader_followers": &cluster_cpu[1..cluster_cpu.len() - 1],
                "cluster_via_leader_producers": cluster_cpu[cluster_cpu.len() - 1],
            },
        }));
    }
    Ok(json!({
        "bench": "cluster", "what": "produce", "brokers": cfg.brokers,
        "message_bytes": cfg.run.message_bytes, "seconds": cfg.run.duration.as_secs_f64(),
        "partitions": 1, "rows": rows,
        "note": "one partition replicated on every broker; any_broker: producer i sends to broker i mod n (two of three forward to the leader)",
    }))
}

/// SIGKILL of the partition's leader, then produces through the other brokers until one is
/// acknowledged: that time, per kill; the killed broker comes back and catches up before the
/// next kill.
async fn failover(cfg: &ClusterBench, dir: &Path, http: &reqwest::Client) -> anyhow::Result<Value> {
    let mut nodes = Nodes::start(dir, cfg.brokers, true, http).await?;
    nodes
        .put_topic(http, "failover", json!({"partitions": 1}))
        .await?;
    let quick = reqwest::Client::builder()
        .timeout(Duration::from_secs(2))
        .build()?;
    let mut times = Latencies::default();
    let mut leaders = std::collections::BTreeMap::<u64, usize>::new();
    let mut n = 0u64;
    for _ in 0..cfg.kills {
        let view = nodes.settled(http).await?;
        let leader = leader_of(&view, "failover").ok_or_else(|| anyhow::anyhow!("no leader"))?;
        *leaders.entry(leader).or_default() += 1;
        nodes.kill(leader);
        let killed = Instant::now();
        let others: Vec<u64> = nodes.running().collect();
        let mut i = 0;
        loop {
            n += 1;
            let via = nodes.url(others[i % others.len()]);
            i += 1;
            let r = quick
                .post(format!("{via}/mmmq/messages"))
                .json(&json!({"topic": "failover", "content": {"n": n}}))
                .send()
                .await;
            if r.is_ok_and(|r| r.status() == 200) {
                break;
            }
            anyhow::ensure!(
                killed.elapsed() < Duration::from_secs(60),
                "no failover in 60 s"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        times.push(killed.elapsed());
        nodes.restart(leader, http).await?;
    }
    let ms = |us: f64| us / 1e3;
    Ok(json!({
        "bench": "cluster", "what": "failover", "brokers": cfg.brokers, "kills": cfg.kills,
        "p50_ms": ms(times.percentile_us(0.5)), "p90_ms": ms(times.percentile_us(0.9)),
        "p99_ms": ms(times.percentile_us(0.99)), "max_ms": ms(times.percentile_us(1.0)),
        "min_ms": ms(times.percentile_us(0.0)), "kills_by_leader": leaders,
        "note": "SIGKILL of the partition's leader → the next produce acknowledged through another broker (tried every 10 ms, 2 s timeout each)",
    }))
}

/// Many partitions, each replicated on every broker, without traffic: each broker's CPU and
/// resident memory.
async fn idle(cfg: &ClusterBench, dir: &Path, http: &reqwest::Client) -> anyhow::Result<Value> {
    let nodes = Nodes::start(dir, cfg.brokers, true, http).await?;
    let per_topic = 10.min(cfg.idle_partitions.max(1));
    let topics = cfg.idle_partitions.div_ceil(per_topic);
    for t in 0..topics {
        nodes
            .put_topic(http, &format!("idle.{t}"), json!({"partitions": per_topic}))
            .await?;
    }
    let view = nodes.settled(http).await?;
    let partitions = view["partitions"].as_array().map_or(0, Vec::len);
    // Let the elections and first heartbeats pass.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let pids: Vec<u32> = nodes.running().filter_map(|id| nodes.pid(id)).collect();
    let before: Vec<u64> = pids.iter().map(|p| cpu_ticks(*p)).collect();
    let start = Instant::now();
    tokio::time::sleep(cfg.idle_seconds).await;
    let secs = start.elapsed().as_secs_f64();
    let hz = clock_ticks_per_second();
    let brokers: Vec<Value> = pids
        .iter()
        .zip(before)
        .enumerate()
        .map(|(i, (pid, before))| {
            let cpu = (cpu_ticks(*pid) - before) as f64 / hz / secs;
            json!({"broker": i + 1, "cpu_percent_of_a_core": cpu * 100.0,
                   "rss_mib": super::rss_kib(*pid) as f64 / 1024.0})
        })
        .collect();
    Ok(json!({
        "bench": "cluster", "what": "idle", "partitions": partitions,
        "replicas_per_partition": cfg.brokers, "seconds": secs, "per_broker": brokers,
    }))
}

/// Runs `load` and answers its result with the CPU time (µs) each of `pids` spent per message
/// it acknowledged: where a configuration's cost goes, since every process here shares the
/// same cores.
async fn cpu_per_message(
    pids: &[u32],
    load: impl std::future::Future<Output = anyhow::Result<super::http::LoadResult>>,
) -> anyhow::Result<(super::http::LoadResult, Vec<f64>)> {
    let before: Vec<u64> = pids.iter().map(|p| cpu_ticks(*p)).collect();
    let r = load.await?;
    let hz = clock_ticks_per_second();
    let per_message = pids
        .iter()
        .zip(before)
        .map(|(p, b)| cpu_ticks(*p).saturating_sub(b) as f64 / hz * 1e6 / r.count.max(1) as f64)
        .collect();
    Ok((r, per_message))
}

/// User and system CPU time of process `pid`, in clock ticks (`/proc/PID/stat` fields 14, 15).
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // The command name may hold spaces: fields are counted after its closing parenthesis.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let field = |n: usize| {
        fields
            .get(n - 3)
            .and_then(|f| f.parse::<u64>().ok())
            .unwrap_or(0)
    };
    field(14) + field(15)
}

fn clock_ticks_per_second() -> f64 {
    // SAFETY: sysconf reads a constant of the system.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if hz > 0 { hz as f64 } else { 100.0 }
}
