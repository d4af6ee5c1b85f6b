//! `dispatchers.json` and deployed plugins on a cluster member (docs/cluster.md, "Configuration
//! in a cluster"): both live in the metadata group, and every broker applies what the metadata
//! says once its metadata is settled. A reload through any broker reads and checks that broker's
//! own file, proposes its text, and answers once this broker applied it; each broker parses the
//! text against its own root dir and applies it as a local reload would, then writes it to its
//! own `dispatchers.json`, so that the file on every broker says what runs.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::{Broker, BrokerError};
use crate::cluster::meta_state::{DispatchersMeta, MetaCommand, MetaOutcome, PluginMeta};
use crate::cluster::node::{Cluster, ClusterError};
use crate::config::{self, ConfigError};
use crate::dispatch::{Dispatch, ReloadReport};
use crate::plugin::store::PluginStore;
use crate::storage::Vfs;

/// How long a reload or a deploy waits for this broker to apply what the metadata group
/// committed.
pub(super) const APPLY_WAIT: Duration = Duration::from_secs(10);

/// The first wait before a plugin that failed to sync is tried again (doubling up to 10 s).
const RETRY_FIRST: Duration = Duration::from_millis(250);

/// What a broker applied of the cluster's configuration.
pub(super) struct ConfigSync {
    pub(super) root: PathBuf,
    pub(super) vfs: Arc<dyn Vfs>,
    pub(super) dispatch: Arc<Dispatch>,
    pub(super) plugins: Arc<PluginStore>,
    /// The last reload applied here (its number in the metadata) and its report: the follower
    /// and the reload's own request both apply it, whichever comes first, once.
    applied: tokio::sync::Mutex<Option<(u64, ReloadReport)>>,
    /// Per plugin, the version made current here (what a deploy through this broker waits
    /// for before it answers).
    pub(super) current: tokio::sync::watch::Sender<BTreeMap<String, String>>,
}

impl ConfigSync {
    pub(super) fn new(
        root: PathBuf,
        vfs: Arc<dyn Vfs>,
        dispatch: Arc<Dispatch>,
        plugins: Arc<PluginStore>,
    ) -> Self {
        Self {
            root,
            vfs,
            dispatch,
            plugins,
            applied: tokio::sync::Mutex::new(None),
            current: tokio::sync::watch::Sender::new(BTreeMap::new()),
        }
    }

    /// Applies the metadata's `dispatchers.json` unless this broker applied that reload (or a
    /// later one) already; answers the report of the reload that applied it.
    async fn apply_dispatchers(&self, d: &DispatchersMeta) -> Result<ReloadReport, BrokerError> {
        let mut applied = self.applied.lock().await;
        if let Some((n, report)) = &*applied
            && *n >= d.reloads
        {
            return Ok(report.clone());
        }
        let (root, text) = (self.root.clone(), d.text.clone());
        let specs = tokio::task::spawn_blocking(move || {
            config::parse_dispatchers(&text, &root.join(FILE), &root)
        })
        .await
        .expect("config task panicked")?;
        let report = self.dispatch.apply(specs).await?;
        tracing::info!(
            ?report,
            reload = d.reloads,
            "dispatchers reloaded (cluster metadata)"
        );
        *applied = Some((d.reloads, report.clone()));
        drop(applied);
        // What runs is what the file says, on every broker (`mmmq` commands, `inspect`, a
        // restart's check of the file).
        let (vfs, path, text) = (self.vfs.clone(), self.root.join(FILE), d.text.clone());
        let written = tokio::task::spawn_blocking(move || {
            let same = crate::storage::vfs::read_whole(&*vfs, &path)
                .ok()
                .flatten()
                .is_some_and(|b| b == text.as_bytes());
            if same {
                return Ok(());
            }
            crate::storage::vfs::replace_durably(&*vfs, &path, text.as_bytes())
        })
        .await
        .expect("config task panicked");
        if let Err(e) = written {
            tracing::warn!(error = %e, "cannot write the cluster's dispatchers.json to this broker's root dir");
        }
        Ok(report)
    }

    /// Seeds the cluster's `dispatchers.json` from this broker's own file if the cluster has
    /// none yet: the first broker to propose wins, the others' proposals change nothing. A file
    /// without dispatchers seeds nothing (another broker's may have some).
    async fn seed(&self, cluster: &Cluster) -> Result<(), BrokerError> {
        let (text, specs) = read_own(&self.root).await?;
        if specs == 0 {
            // The cluster names no dispatchers and this broker proposes none: there are none
            // whose positions retention must hold (until a reload or another broker's seed).
            self.dispatch.configuration_is_known();
            return Ok(());
        }
        let seed = MetaCommand::SetDispatchers {
            text,
            only_if_unset: true,
        };
        match cluster.propose(seed).await? {
            MetaOutcome::Done => Ok(()),
            MetaOutcome::Refused(why) => Err(ClusterError::Refused(why).into()),
            MetaOutcome::TopicExists | MetaOutcome::Each(_) => {
                unreachable!("not a topic or positions command")
            }
        }
    }
}

/// The file's name in a root dir.
const FILE: &str = "dispatchers.json";

/// This broker's own `dispatchers.json` (made `[]` when missing, as at boot), checked: its text
/// and how many dispatchers it names.
async fn read_own(root: &Path) -> Result<(String, usize), BrokerError> {
    let root = root.to_owned();
    tokio::task::spawn_blocking(move || {
        let path = root.join(FILE);
        let io = |error| ConfigError::Io {
            path: path.clone(),
            error,
        };
        let text = match std::fs::read_to_string(&path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                config::load_dispatchers(&root)?;
                std::fs::read_to_string(&path).map_err(io)?
            }
            Err(e) => return Err(io(e)),
        };
        let specs = config::parse_dispatchers(&text, &path, &root)?;
        Ok((text, specs.len()))
    })
    .await
    .expect("config task panicked")
    .map_err(BrokerError::Config)
}

impl Broker {
    /// `POST /mmmq/admin/reload` (and SIGHUP, `mmmq reload`) on a cluster member: this broker's
    /// file, checked here (a bad one changes nothing anywhere), becomes the cluster's; answered
    /// with this broker's report once it applied it.
    pub(super) async fn reload_clustered(
        &self,
        cluster: &Cluster,
    ) -> Result<ReloadReport, BrokerError> {
        let (text, _) = read_own(&self.config.root_dir).await?;
        let before = cluster
            .metadata()
            .dispatchers
            .as_ref()
            .map_or(0, |d| d.reloads);
        let set = MetaCommand::SetDispatchers {
            text: text.clone(),
            only_if_unset: false,
        };
        match cluster.propose(set).await? {
            MetaOutcome::Done => {}
            MetaOutcome::Refused(why) => return Err(ClusterError::Refused(why).into()),
            MetaOutcome::TopicExists | MetaOutcome::Each(_) => {
                unreachable!("not a topic or positions command")
            }
        }
        let mut metadata = cluster.watch_metadata();
        let ours = |d: &Option<DispatchersMeta>| {
            d.as_ref()
                .filter(|d| d.reloads > before && d.text == text)
                .cloned()
        };
        let applied = tokio::time::timeout(
            APPLY_WAIT,
            metadata.wait_for(|m| ours(&m.dispatchers).is_some()),
        )
        .await
        .ok()
        .and_then(Result::ok)
        .and_then(|m| ours(&m.dispatchers));
        let Some(d) = applied else {
            return Err(ClusterError::Failed(format!(
                "the reload was committed, but this broker did not apply it within {} s (another reload may have replaced it)",
                APPLY_WAIT.as_secs()
            ))
            .into());
        };
        self.config_sync.apply_dispatchers(&d).await
    }
}

/// Applies the metadata's configuration on this broker, from the moment its metadata is settled
/// (a broker replaying its metadata at boot applies none of the past configurations on the way)
/// and at every change after: `dispatchers.json` (seeded from this broker's own file if the
/// cluster has none yet), and each plugin's current version (its bytes fetched from another
/// broker when this one lacks them). A plugin that fails is tried again later.
pub(super) async fn follow(sync: Arc<ConfigSync>, cluster: Cluster, stop: CancellationToken) {
    tokio::select! {
        _ = cluster.metadata_settles() => {}
        _ = stop.cancelled() => return,
    }
    let mut metadata = cluster.watch_metadata();
    let mut seeded = false;
    // A reload this broker cannot apply (its plugin file does not parse here…) is not tried
    // again until the next one.
    let mut failed_reload = None;
    let mut synced: BTreeMap<String, PluginMeta> = BTreeMap::new();
    let mut retry = RETRY_FIRST;
    loop {
        let state = metadata.borrow_and_update().clone();
        let mut again = false;
        match &state.dispatchers {
            None if !seeded => match sync.seed(&cluster).await {
                Ok(()) => seeded = true,
                Err(error) => {
                    tracing::debug!(%error, "seeding the cluster's dispatchers.json; trying again");
                    again = true;
                }
            },
            Some(d) if failed_reload != Some(d.reloads) => {
                if let Err(error) = sync.apply_dispatchers(d).await {
                    tracing::error!(%error, reload = d.reloads, "this broker cannot apply the cluster's dispatchers.json; the running configuration stays");
                    failed_reload = Some(d.reloads);
                }
            }
            _ => {}
        }
        for (name, plugin) in &state.plugins {
            if synced.get(name) == Some(plugin) {
                continue;
            }
            match sync.sync_plugin(&cluster, name, plugin).await {
                Ok(()) => {
                    synced.insert(name.clone(), plugin.clone());
                }
                Err(error) => {
                    tracing::warn!(plugin = %name, version = %plugin.current, %error, "making the cluster's plugin version current here; trying again");
                    again = true;
                }
            }
        }
        // Every broker runs its part of each redrive: the partition's leader delivers it.
        if !super::cluster_redrive::follow(&sync.dispatch, &cluster).await {
            again = true;
        }
        let wait = if again {
            let wait = retry;
            retry = (retry * 2).min(Duration::from_secs(10));
            wait
        } else {
            retry = RETRY_FIRST;
            Duration::MAX
        };
        // A change, or the time to try again what failed.
        tokio::select! {
            changed = tokio::time::timeout(wait, metadata.changed()) => {
                if matches!(changed, Ok(Err(_))) { return }
            }
            _ = stop.cancelled() => return,
        }
    }
}
