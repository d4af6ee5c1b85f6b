//! The configuration a cluster shares through its metadata (docs/cluster.md, "Configuration in a
//! cluster"): the text of `dispatchers.json` and each deployed plugin's versions. Only what
//! decides is kept here, never a component's bytes: the metadata is cloned at every apply and
//! snapshotted whole, so each broker keeps the bytes in its own plugin store and fetches a
//! version it lacks from the broker that holds it.

use mmmq_core::VersionInfo;
use openraft::async_runtime::WatchReceiver;
use serde::{Deserialize, Serialize};

use super::meta_state::MetaState;
use super::node::Cluster;
use super::types::BrokerId;

/// `dispatchers.json` as the cluster runs it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DispatchersMeta {
    /// The file's text, parsed by each broker against its own root dir (a `plugin.path` names a
    /// file there).
    pub text: String,
    /// Counts reloads: every broker applies the text again when it grows, so that a reload of
    /// an unchanged file still re-reads the plugin files everywhere, as on one broker.
    pub reloads: u64,
}

/// A deployed plugin as the cluster runs it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PluginMeta {
    /// The version every broker makes current.
    pub current: String,
    /// The kept versions, the last deployed last (at most [`KEPT_VERSIONS`], the current one
    /// always among them).
    pub versions: Vec<KeptVersion>,
}

/// One kept version, and where its bytes are.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct KeptVersion {
    /// What `GET /mmmq/plugins` shows of it.
    #[serde(flatten)]
    pub info: VersionInfo,
    /// The broker the deploy went through, which kept its bytes before proposing it (asked
    /// first by a broker that lacks them; any broker that made it current has them too).
    pub holder: BrokerId,
}

/// Versions kept per plugin, as a single broker keeps them (contract §11: at least 10).
pub const KEPT_VERSIONS: usize = crate::plugin::kept::KEPT_VERSIONS;

impl MetaState {
    /// `SetDispatchers`: the new text, unless `only_if_unset` and the cluster has one already
    /// (a broker's boot seeds the metadata from its own file only once, for every broker).
    pub(super) fn set_dispatchers(
        &mut self,
        text: &str,
        only_if_unset: bool,
    ) -> Result<(), String> {
        match &mut self.dispatchers {
            Some(_) if only_if_unset => {}
            Some(d) => {
                d.text = text.to_owned();
                d.reloads += 1;
            }
            None => {
                self.dispatchers = Some(DispatchersMeta {
                    text: text.to_owned(),
                    reloads: 1,
                })
            }
        }
        Ok(())
    }

    /// `DeployPlugin`: `version` becomes the plugin's newest kept version and its current one;
    /// the oldest past [`KEPT_VERSIONS`] are dropped.
    pub(super) fn deploy_plugin(
        &mut self,
        name: &str,
        version: &VersionInfo,
        holder: BrokerId,
    ) -> Result<(), String> {
        let plugin = self.plugins.entry(name.to_owned()).or_default();
        plugin
            .versions
            .retain(|v| v.info.version != version.version);
        plugin.versions.push(KeptVersion {
            info: version.clone(),
            holder,
        });
        plugin.current = version.version.clone();
        while plugin.versions.len() > KEPT_VERSIONS {
            match plugin
                .versions
                .iter()
                .position(|v| v.info.version != plugin.current)
            {
                Some(i) => plugin.versions.remove(i),
                None => break,
            };
        }
        Ok(())
    }

    /// `SwitchPlugin`: a kept version becomes current; refused when `if_current` names another
    /// version than the current one (a rollback decided on a broker whose metadata lagged).
    pub(super) fn switch_plugin(
        &mut self,
        name: &str,
        version: &str,
        if_current: Option<&str>,
    ) -> Result<(), String> {
        let plugin = self
            .plugins
            .get_mut(name)
            .ok_or_else(|| format!("no plugin named {name:?} was deployed"))?;
        if let Some(expected) = if_current
            && expected != plugin.current
        {
            return Err(format!(
                "plugin {name:?}'s current version is {}, not {expected}",
                plugin.current
            ));
        }
        if !plugin.versions.iter().any(|v| v.info.version == version) {
            return Err(format!("plugin {name:?} has no version {version:?}"));
        }
        plugin.current = version.to_owned();
        Ok(())
    }
}

impl PluginMeta {
    /// The kept version `version`, if it is one.
    pub fn version(&self, version: &str) -> Option<&KeptVersion> {
        self.versions.iter().find(|v| v.info.version == version)
    }

    /// The version deployed before the current one (what a rollback makes current).
    pub fn previous(&self) -> Option<&KeptVersion> {
        let at = self
            .versions
            .iter()
            .position(|v| v.info.version == self.current)?;
        self.versions.get(at.checked_sub(1)?)
    }
}

impl Cluster {
    /// Waits until this broker applied every metadata entry its log holds
    /// ([`Cluster::metadata_settled`]): a broker replaying its metadata at boot goes through
    /// every past configuration, and none of them is applied on the way.
    pub async fn metadata_settles(&self) {
        let mut metrics = self.inner.meta.metrics();
        loop {
            if self.metadata_settled() {
                return;
            }
            if metrics.changed().await.is_err() {
                // The group stopped: this broker is shutting down.
                return std::future::pending().await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::meta_state::{MetaCommand, MetaOutcome};
    use super::*;

    fn info(n: u32) -> VersionInfo {
        VersionInfo {
            version: format!("{n:016x}"),
            bytes: 10,
            deployed_at: n as u64,
            world: "w".into(),
        }
    }

    fn deploy(state: &mut MetaState, n: u32) -> MetaOutcome {
        state.apply(&MetaCommand::DeployPlugin {
            name: "p".into(),
            version: info(n),
            holder: 1,
        })
    }

    #[test]
    fn a_seed_sets_only_an_unset_text_and_each_reload_counts() {
        let mut s = MetaState::default();
        let set = |text: &str, only_if_unset| MetaCommand::SetDispatchers {
            text: text.into(),
            only_if_unset,
        };
        assert_eq!(s.apply(&set("[1]", true)), MetaOutcome::Done);
        assert_eq!(s.apply(&set("[2]", true)), MetaOutcome::Done);
        let d = s.dispatchers.clone().unwrap();
        assert_eq!((d.text.as_str(), d.reloads), ("[1]", 1));
        s.apply(&set("[1]", false));
        s.apply(&set("[3]", false));
        let d = s.dispatchers.clone().unwrap();
        assert_eq!((d.text.as_str(), d.reloads), ("[3]", 3));
        // A snapshot of a state without the field reads as none.
        let old: MetaState =
            serde_json::from_str(r#"{"brokers":{},"retired":[],"topics":{},"created":0}"#).unwrap();
        assert_eq!(old.dispatchers, None);
        assert!(old.plugins.is_empty());
    }

    #[test]
    fn deploys_keep_the_last_ten_and_switches_check_what_they_expect() {
        let mut s = MetaState::default();
        for n in 0..12 {
            assert_eq!(deploy(&mut s, n), MetaOutcome::Done);
        }
        let p = &s.plugins["p"];
        assert_eq!(p.versions.len(), KEPT_VERSIONS);
        assert_eq!(p.versions[0].info, info(2));
        assert_eq!(p.current, info(11).version);
        assert_eq!(p.previous().unwrap().info, info(10));
        let switch = |version: &str, if_current: Option<&str>| MetaCommand::SwitchPlugin {
            name: "p".into(),
            version: version.into(),
            if_current: if_current.map(str::to_owned),
        };
        // A rollback decided on a lagging broker is refused.
        let stale = switch(&info(9).version, Some(&info(10).version));
        assert!(matches!(s.apply(&stale), MetaOutcome::Refused(_)));
        let rollback = switch(&info(10).version, Some(&info(11).version));
        assert_eq!(s.apply(&rollback), MetaOutcome::Done);
        assert_eq!(s.plugins["p"].current, info(10).version);
        assert!(matches!(
            s.apply(&switch(&info(1).version, None)),
            MetaOutcome::Refused(_)
        ));
        // Deploying a kept version again makes it the newest.
        deploy(&mut s, 3);
        let p = &s.plugins["p"];
        assert_eq!(p.versions.last().unwrap().info, info(3));
        assert_eq!(p.versions.len(), KEPT_VERSIONS);
        let roundtrip: MetaState =
            serde_json::from_str(&serde_json::to_string(&s).unwrap()).unwrap();
        assert_eq!(roundtrip, s);
    }
}
