//! Deployed plugins (docs/plugins.md, "Deploying plugins by API"): deploy, list, rollback and activate, each
//! switching the dispatchers that name the plugin before it answers. On a cluster member each
//! change goes through the metadata (docs/cluster.md, "Configuration in a cluster").

use mmmq_core::PluginListing;

use super::Broker;
use crate::plugin::store::{Deployed, PluginVersions, StoreError};

impl Broker {
    /// Validates and stores a component as the new current version of `name`.
    pub async fn deploy_plugin(&self, name: &str, bytes: Vec<u8>) -> Result<Deployed, StoreError> {
        if let Some(cluster) = self.cluster() {
            return self.deploy_clustered(cluster, name, bytes).await;
        }
        let deployed = self.plugins.deploy(name, bytes).await;
        self.switched(deployed, "deployed").await
    }

    /// Makes the version deployed before the current one current.
    pub async fn rollback_plugin(&self, name: &str) -> Result<Deployed, StoreError> {
        if let Some(cluster) = self.cluster() {
            return self.rollback_clustered(cluster, name).await;
        }
        let deployed = self.plugins.rollback(name).await;
        self.switched(deployed, "rolled back").await
    }

    /// Makes a kept version current.
    pub async fn activate_plugin(&self, name: &str, version: &str) -> Result<Deployed, StoreError> {
        if let Some(cluster) = self.cluster() {
            return self.activate_clustered(cluster, name, version).await;
        }
        let deployed = self.plugins.activate(name, version).await;
        self.switched(deployed, "activated").await
    }

    /// After a change of current version: the dispatchers naming the plugin switch now.
    async fn switched(
        &self,
        deployed: Result<Deployed, StoreError>,
        what: &str,
    ) -> Result<Deployed, StoreError> {
        let d = deployed?;
        tracing::info!(
            plugin = d.name,
            version = d.version,
            world = d.world,
            "plugin {what}"
        );
        self.dispatch.reload_plugin(&d.name).await;
        Ok(d)
    }

    /// Every deployed plugin with its versions and the dispatchers that run it.
    pub async fn plugins(&self) -> Result<Vec<PluginListing>, StoreError> {
        Ok(self
            .plugins
            .list()
            .await?
            .into_iter()
            .map(
                |PluginVersions {
                     name,
                     current,
                     versions,
                 }| PluginListing {
                    used_by: self.dispatch.users_of_plugin(&name),
                    name,
                    current,
                    versions,
                },
            )
            .collect())
    }
}
