use std::time::Duration;

use mmmq_core::{
    Deployed, DispatcherStatus, GroupStatus, PluginListing, RedriveStatus, ReloadReport,
    TopicDetail, TopicInfo,
};
use serde::{Deserialize, Serialize};

use crate::conn::{Conn, decode, status_error};
use crate::error::ClientError;

/// The fields of a topic's configuration to set (`PUT /mmmq/topics/{topic}`); `None` leaves a
/// field as it is (or at the broker's default for a new topic).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TopicSettings {
    /// Partitions (1 until partitioned topics exist).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub partitions: Option<u32>,
    /// `Some(None)` keeps messages forever.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retention_ms: Option<Option<u64>>,
    /// `Some(None)`: no size limit.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retention_bytes: Option<Option<u64>>,
    /// Retention never deletes what a dispatcher has not passed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub keep_undelivered: Option<bool>,
    /// How long a produce id is remembered.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dedup_window_ms: Option<u64>,
}

/// Views of a broker, and its topics' lifecycle.
#[derive(Debug, Clone)]
pub struct Admin {
    conn: Conn,
}

impl Admin {
    /// Sends `Authorization: Bearer <token>` (for a broker started with `--auth-token`).
    pub fn auth_token(mut self, token: Option<String>) -> Self {
        self.conn.set_token(token);
        self
    }

    /// For the broker at `broker`.
    pub fn new(broker: &str) -> Result<Self, ClientError> {
        Ok(Self {
            conn: Conn::new(broker, Duration::from_secs(30))?,
        })
    }

    async fn get<T: for<'de> Deserialize<'de>>(&self, path: &str) -> Result<T, ClientError> {
        self.call(reqwest::Method::GET, path, None).await
    }

    /// Sends a request and decodes a `200` answer; anything else is the broker's error.
    async fn call<T: for<'de> Deserialize<'de>>(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Vec<u8>>,
    ) -> Result<T, ClientError> {
        match self.conn.send(method, path, body).await? {
            (200, bytes) => decode(&bytes),
            (status, bytes) => Err(status_error(status, &bytes)),
        }
    }

    /// Every topic.
    pub async fn topics(&self) -> Result<Vec<TopicInfo>, ClientError> {
        self.get("/mmmq/topics").await
    }

    /// One topic's configuration and partitions; `NotFound` if there is no such topic.
    pub async fn topic(&self, name: &str) -> Result<TopicDetail, ClientError> {
        let path = format!("/mmmq/topics/{name}");
        match self.conn.send(reqwest::Method::GET, &path, None).await? {
            (200, bytes) => decode(&bytes),
            (404, _) => Err(ClientError::NoSuchTopic(name.to_owned())),
            (status, bytes) => Err(status_error(status, &bytes)),
        }
    }

    /// Creates `name`, or changes the fields `settings` names.
    pub async fn put_topic(
        &self,
        name: &str,
        settings: &TopicSettings,
    ) -> Result<TopicDetail, ClientError> {
        let body = serde_json::to_vec(settings).expect("settings serialize");
        self.call(
            reqwest::Method::PUT,
            &format!("/mmmq/topics/{name}"),
            Some(body),
        )
        .await
    }

    /// Deletes `name`: its messages, checkpoints and dispatcher workers.
    pub async fn delete_topic(&self, name: &str) -> Result<(), ClientError> {
        let path = format!("/mmmq/topics/{name}");
        match self.conn.send(reqwest::Method::DELETE, &path, None).await? {
            (200, _) => Ok(()),
            (404, _) => Err(ClientError::NoSuchTopic(name.to_owned())),
            (status, bytes) => Err(status_error(status, &bytes)),
        }
    }

    /// Every pull consumer group: members, assignments, committed offsets and lag (the
    /// broker answers a page at a time; this follows the pages to the end).
    pub async fn groups(&self) -> Result<Vec<GroupStatus>, ClientError> {
        let mut all: Vec<GroupStatus> = Vec::new();
        loop {
            let path = match all.last() {
                Some(last) => format!("/mmmq/groups?limit=1000&after={}", last.group),
                None => "/mmmq/groups?limit=1000".to_owned(),
            };
            let page: Vec<GroupStatus> = self.get(&path).await?;
            // Names come in order; a broker from before paging answers every group each time,
            // so what is not past the last name is not new.
            let last = all.last().map(|g| g.group.clone());
            let before = all.len();
            all.extend(
                page.into_iter()
                    .filter(|g| last.as_ref().is_none_or(|l| g.group > *l)),
            );
            if all.len() == before {
                return Ok(all);
            }
        }
    }

    /// The cluster as the broker sees it: brokers, and per partition its leader, replicas, term
    /// and lag (`clustered: false` from a single-node broker).
    pub async fn cluster(&self) -> Result<mmmq_core::cluster::ClusterView, ClientError> {
        self.get("/mmmq/cluster").await
    }

    /// Gives each request up to `timeout` (30 s by default): a membership change waits for new
    /// replicas to catch up, which takes as long as copying what they lack.
    pub fn timeout(mut self, timeout: Duration) -> Result<Self, ClientError> {
        self.conn = self.conn.with_timeout(timeout)?;
        Ok(self)
    }

    /// Adds broker `id`, started at `address` with `--peers` naming the cluster's brokers and
    /// itself (`POST /mmmq/cluster/brokers`). Answers the cluster as it is then.
    pub async fn add_broker(
        &self,
        id: u64,
        address: &str,
    ) -> Result<mmmq_core::cluster::ClusterView, ClientError> {
        let body = mmmq_core::cluster::NewBroker {
            id,
            address: address.to_owned(),
        };
        let body = serde_json::to_vec(&body).expect("a broker serializes");
        self.call(reqwest::Method::POST, "/mmmq/cluster/brokers", Some(body))
            .await
    }

    /// Removes broker `id` once its replicas moved to other brokers (`DELETE
    /// /mmmq/cluster/brokers/{id}`); its id is never used again.
    pub async fn remove_broker(
        &self,
        id: u64,
    ) -> Result<mmmq_core::cluster::ClusterView, ClientError> {
        let path = format!("/mmmq/cluster/brokers/{id}");
        self.call(reqwest::Method::DELETE, &path, None).await
    }

    /// Moves partition `partition` of `topic` to `replicas`, preferred leader first (`PUT
    /// /mmmq/cluster/partitions/{topic}/{partition}`), while it takes produces.
    pub async fn reassign(
        &self,
        topic: &str,
        partition: u32,
        replicas: &[u64],
    ) -> Result<mmmq_core::cluster::ClusterView, ClientError> {
        let body = mmmq_core::cluster::Reassignment {
            replicas: replicas.to_vec(),
        };
        let body = serde_json::to_vec(&body).expect("replicas serialize");
        let path = format!("/mmmq/cluster/partitions/{topic}/{partition}");
        self.call(reqwest::Method::PUT, &path, Some(body)).await
    }

    /// Every dispatcher.
    pub async fn dispatchers(&self) -> Result<Vec<DispatcherStatus>, ClientError> {
        self.get("/mmmq/dispatchers").await
    }

    /// Makes the broker re-read `dispatchers.json` and its plugin files (`POST
    /// /mmmq/admin/reload`). A bad file is refused with the reason (`ClientError::Rejected`) and
    /// the running dispatchers stay.
    pub async fn reload(&self) -> Result<ReloadReport, ClientError> {
        self.call(reqwest::Method::POST, "/mmmq/admin/reload", None)
            .await
    }

    /// Delivers `consumer_id`'s dead letters again to its own target: offsets `from`…`to`−1 of
    /// `__dlq.<consumerId>` (`None`: from where the last redrive stopped; to the end). Answers
    /// the redrive's status as it starts; its progress is in [`Admin::dispatchers`].
    pub async fn redrive(
        &self,
        consumer_id: &str,
        from: Option<u64>,
        to: Option<u64>,
    ) -> Result<RedriveStatus, ClientError> {
        let mut body = serde_json::Map::new();
        if let Some(f) = from {
            body.insert("from".into(), f.into());
        }
        if let Some(t) = to {
            body.insert("to".into(), t.into());
        }
        let body = serde_json::to_vec(&body).expect("a map serializes");
        let path = format!("/mmmq/dispatchers/{consumer_id}/redrive");
        self.call(reqwest::Method::POST, &path, Some(body)).await
    }

    /// Deploys a component as the new current version of the plugin `name` (docs/plugins.md,
    /// "Deploying plugins by API"); dispatchers naming it switch before this returns.
    pub async fn deploy_plugin(
        &self,
        name: &str,
        component: Vec<u8>,
    ) -> Result<Deployed, ClientError> {
        let path = format!("/mmmq/plugins/{name}");
        match self
            .conn
            .send_as(
                reqwest::Method::PUT,
                &path,
                Some(component),
                "application/wasm",
            )
            .await?
        {
            (200, bytes) => decode(&bytes),
            (status, bytes) => Err(status_error(status, &bytes)),
        }
    }

    /// Every deployed plugin with its kept versions and the dispatchers that run it.
    pub async fn plugins(&self) -> Result<Vec<PluginListing>, ClientError> {
        self.get("/mmmq/plugins").await
    }

    /// Makes the version deployed before the current one current.
    pub async fn rollback_plugin(&self, name: &str) -> Result<Deployed, ClientError> {
        let path = format!("/mmmq/plugins/{name}/rollback");
        self.call(reqwest::Method::POST, &path, None).await
    }

    /// Makes a kept version current.
    pub async fn activate_plugin(
        &self,
        name: &str,
        version: &str,
    ) -> Result<Deployed, ClientError> {
        let path = format!("/mmmq/plugins/{name}/versions/{version}/activate");
        self.call(reqwest::Method::POST, &path, None).await
    }
}
