//! Deployed plugins as the API shows them (docs/plugins.md, "Deploying plugins by API").

use serde::{Deserialize, Serialize};

/// One kept version of a deployed plugin.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct VersionInfo {
    /// 16 hex digits of the component's SHA-256.
    pub version: String,
    /// Its size.
    pub bytes: u64,
    /// Milliseconds since the Unix epoch.
    pub deployed_at: u64,
    /// Its WIT world.
    pub world: String,
}

/// The answer to a deploy, rollback or activation: what is current now.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Deployed {
    /// The plugin.
    pub name: String,
    /// Its current version.
    pub version: String,
    /// That version's world.
    pub world: String,
}

/// A deployed plugin as `GET /mmmq/plugins` lists it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct PluginListing {
    /// The name.
    pub name: String,
    /// The current version.
    pub current: String,
    /// Kept versions, oldest first.
    pub versions: Vec<VersionInfo>,
    /// The dispatchers that run it.
    pub used_by: Vec<String>,
}
