//! Plugin deploys on a cluster member (docs/cluster.md, "Configuration in a cluster"): the broker
//! a deploy goes through validates the component and keeps its bytes, then proposes the version
//! to the metadata group; every broker makes the metadata's current version current in its own
//! store (fetching the bytes from a broker that has them, `GET /mmmq/internal/plugins/{name}/
//! {version}`, checked against the version's SHA-256) and switches the dispatchers that name it.
//! A rollback or an activation is a metadata command too.

use std::time::Duration;

use mmmq_core::Deployed;

use super::Broker;
use super::cluster_config::{APPLY_WAIT, ConfigSync};
use crate::cluster::meta_state::{MetaCommand, MetaOutcome, PluginMeta};
use crate::cluster::node::{Cluster, ClusterError};
use crate::plugin::runtime::version_of;
use crate::plugin::store::{PluginStore, StoreError, cluster::Adopted};

/// How long a fetch of a version's bytes from one broker may take (up to 64 MiB).
const FETCH_TIMEOUT: Duration = Duration::from_secs(60);

/// How many times a rollback decided on this broker's metadata is proposed again when the
/// current version changed under it.
const ROLLBACK_TRIES: usize = 5;

impl ConfigSync {
    /// Makes `plugin`'s current version current here: its bytes fetched first if this broker
    /// lacks them; the dispatchers naming it switch before this returns.
    pub(super) async fn sync_plugin(
        &self,
        cluster: &Cluster,
        name: &str,
        plugin: &PluginMeta,
    ) -> Result<(), StoreError> {
        let version = &plugin.current;
        if !self.plugins.holds(name, version).await {
            let kept = plugin.version(version).ok_or_else(|| {
                ClusterError::Failed(format!(
                    "the metadata's plugin {name:?} does not keep its current version {version}"
                ))
            })?;
            let bytes = fetch(cluster, name, version, kept.holder).await?;
            self.plugins.keep_bytes(name, version, bytes).await?;
        }
        let adopted = Adopted {
            current: version.clone(),
            versions: plugin.versions.iter().map(|v| v.info.clone()).collect(),
        };
        if self.plugins.adopt(name, adopted).await? {
            tracing::info!(
                plugin = name,
                version,
                "plugin version made current (cluster metadata)"
            );
            self.dispatch.reload_plugin(name).await;
        }
        self.current.send_modify(|m| {
            m.insert(name.to_owned(), version.clone());
        });
        Ok(())
    }
}

/// The bytes of `version` of `name`, from the broker that kept them at the deploy, else from any
/// other broker; checked against the version (its SHA-256).
async fn fetch(
    cluster: &Cluster,
    name: &str,
    version: &str,
    holder: u64,
) -> Result<Vec<u8>, ClusterError> {
    let me = cluster.id();
    let mut from: Vec<u64> = vec![holder];
    from.extend(cluster.metadata().brokers.keys().copied());
    from.retain(|b| *b != me);
    let path = format!("/mmmq/internal/plugins/{name}/{version}");
    let mut errors = Vec::new();
    for (i, b) in from.iter().enumerate() {
        if from[..i].contains(b) {
            continue;
        }
        let answer = cluster
            .forward_http(*b, reqwest::Method::GET, &path, None, FETCH_TIMEOUT)
            .await;
        match answer {
            Ok(a) if a.status == 200 && version_of(&a.body) == version => {
                tracing::debug!(plugin = name, version, from = b, "plugin version fetched");
                return Ok(a.body.to_vec());
            }
            Ok(a) if a.status == 200 => errors.push(format!("broker {b}: other bytes")),
            Ok(a) => errors.push(format!("broker {b}: HTTP {}", a.status)),
            Err(e) => errors.push(e.to_string()),
        }
    }
    Err(ClusterError::Failed(format!(
        "no broker gave the bytes of plugin {name:?} version {version} ({})",
        errors.join("; ")
    )))
}

impl Broker {
    /// A deploy on a cluster member: validated and kept here, proposed, answered once this
    /// broker made it current (every other broker does as it applies it).
    pub(super) async fn deploy_clustered(
        &self,
        cluster: &Cluster,
        name: &str,
        bytes: Vec<u8>,
    ) -> Result<Deployed, StoreError> {
        let (info, _) = self.plugins.keep_unindexed(name, bytes).await?;
        let deploy = MetaCommand::DeployPlugin {
            name: name.to_owned(),
            version: info.clone(),
            holder: cluster.id(),
        };
        decided(cluster.propose(deploy).await?)?;
        self.current_here(cluster, name, &info.version).await?;
        Ok(Deployed {
            name: name.to_owned(),
            version: info.version,
            world: info.world,
        })
    }

    /// A rollback on a cluster member: the version before the current one in this broker's
    /// metadata, proposed only if the current one is still what it saw.
    pub(super) async fn rollback_clustered(
        &self,
        cluster: &Cluster,
        name: &str,
    ) -> Result<Deployed, StoreError> {
        PluginStore::check_name(name)?;
        let mut metadata = cluster.watch_metadata();
        let mut tries = 0;
        loop {
            let plugin = known(cluster, name)?;
            let previous = plugin
                .previous()
                .ok_or_else(|| StoreError::NoPrevious(name.to_owned()))?
                .info
                .clone();
            let switch = MetaCommand::SwitchPlugin {
                name: name.to_owned(),
                version: previous.version.clone(),
                if_current: Some(plugin.current.clone()),
            };
            match cluster.propose(switch).await? {
                MetaOutcome::Refused(_) if tries + 1 < ROLLBACK_TRIES => {
                    // The current version changed and this broker has not seen it yet.
                    tries += 1;
                    metadata.borrow_and_update();
                    let _ = tokio::time::timeout(Duration::from_secs(1), metadata.changed()).await;
                    continue;
                }
                outcome => decided(outcome)?,
            }
            self.current_here(cluster, name, &previous.version).await?;
            return Ok(Deployed {
                name: name.to_owned(),
                version: previous.version,
                world: previous.world,
            });
        }
    }

    /// An activation on a cluster member.
    pub(super) async fn activate_clustered(
        &self,
        cluster: &Cluster,
        name: &str,
        version: &str,
    ) -> Result<Deployed, StoreError> {
        PluginStore::check_name(name)?;
        let plugin = known(cluster, name)?;
        let kept = plugin
            .version(version)
            .ok_or_else(|| StoreError::NoSuchVersion {
                name: name.to_owned(),
                version: version.to_owned(),
                kept: plugin
                    .versions
                    .iter()
                    .map(|v| v.info.version.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
            })?
            .info
            .clone();
        let switch = MetaCommand::SwitchPlugin {
            name: name.to_owned(),
            version: version.to_owned(),
            if_current: None,
        };
        decided(cluster.propose(switch).await?)?;
        self.current_here(cluster, name, version).await?;
        Ok(Deployed {
            name: name.to_owned(),
            version: kept.version,
            world: kept.world,
        })
    }

    /// Waits until this broker made `version` of `name` current, or its metadata made another
    /// version current after it (a later deploy or rollback through another broker).
    async fn current_here(
        &self,
        cluster: &Cluster,
        name: &str,
        version: &str,
    ) -> Result<(), StoreError> {
        let mut current = self.config_sync.current.subscribe();
        let done = |m: &std::collections::BTreeMap<String, String>| {
            m.get(name).is_some_and(|v| v == version)
        };
        if tokio::time::timeout(APPLY_WAIT, current.wait_for(done))
            .await
            .is_ok()
        {
            return Ok(());
        }
        let replaced = cluster
            .metadata()
            .plugins
            .get(name)
            .is_some_and(|p| p.current != version && p.version(version).is_some());
        if replaced {
            return Ok(());
        }
        Err(ClusterError::Failed(format!(
            "plugin {name:?} version {version} was committed, but this broker did not make it current within {} s",
            APPLY_WAIT.as_secs()
        ))
        .into())
    }

    /// The bytes of a version this broker keeps, for another broker of the cluster.
    pub async fn plugin_version_bytes(
        &self,
        name: &str,
        version: &str,
    ) -> Result<Option<Vec<u8>>, StoreError> {
        self.plugins.version_bytes(name, version).await
    }
}

/// The metadata's entry of `name`, as this broker applied it.
fn known(cluster: &Cluster, name: &str) -> Result<PluginMeta, StoreError> {
    cluster
        .metadata()
        .plugins
        .get(name)
        .cloned()
        .ok_or_else(|| StoreError::NoSuchPlugin(name.to_owned()))
}

/// A metadata answer as a store's: refused is the caller's to fix.
fn decided(outcome: MetaOutcome) -> Result<(), StoreError> {
    match outcome {
        MetaOutcome::Done => Ok(()),
        MetaOutcome::Refused(why) => Err(ClusterError::Refused(why).into()),
        MetaOutcome::TopicExists | MetaOutcome::Each(_) => {
            unreachable!("not a topic or positions command")
        }
    }
}
