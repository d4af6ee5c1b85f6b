//! `serve --node-id N --peers 1=HOST:PORT,…` (contract §13; docs/cluster.md, "Design"): the
//! settings of a broker that is a cluster member, checked before anything starts.

use std::collections::BTreeMap;

/// A cluster member's settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterSettings {
    /// This broker's id (`--node-id`, at least 1).
    pub node_id: u64,
    /// Every initial broker's HTTP address by id, this one's included (`--peers`).
    pub peers: BTreeMap<u64, String>,
    /// Whether tests may cut or slow this broker's Raft traffic and make its disk refuse writes
    /// (`--fault-injection`).
    pub fault_injection: bool,
    /// Raft's heartbeat interval (ms).
    pub heartbeat_ms: u64,
    /// The election timeout's lower bound (ms); the upper is twice it.
    pub election_ms: u64,
    /// The members' secret, from `--cluster-secret-file` (docs/cluster.md, "Who may speak for
    /// the cluster"); else the one the cluster draws when it forms.
    pub secret: Option<String>,
}

/// Heartbeats every 100 ms and elections after 500–1,000 ms of silence: a failover well under
/// contract §13's 2.5 s median on a LAN, and a stalled fsync (~200 ms here) does not depose a
/// leader.
pub const HEARTBEAT_MS: u64 = 100;
/// See [`HEARTBEAT_MS`].
pub const ELECTION_MS: u64 = 500;

impl ClusterSettings {
    /// Settings from `--node-id` and `--peers`, checked: ids at least 1 and distinct, addresses
    /// `host:port`, this broker among the peers.
    pub fn parse(node_id: u64, peers: &str) -> Result<Self, String> {
        if node_id == 0 {
            return Err("--node-id must be at least 1".into());
        }
        let peers = parse_peers(peers)?;
        if !peers.contains_key(&node_id) {
            return Err(format!(
                "--peers names no broker {node_id}: list every broker of the cluster, this one too"
            ));
        }
        Ok(Self {
            node_id,
            peers,
            fault_injection: false,
            heartbeat_ms: HEARTBEAT_MS,
            election_ms: ELECTION_MS,
            secret: None,
        })
    }

    /// This broker's own address.
    pub fn addr(&self) -> &str {
        &self.peers[&self.node_id]
    }
}

/// `1=127.0.0.1:8081,2=127.0.0.1:8082` → ids to addresses.
pub fn parse_peers(text: &str) -> Result<BTreeMap<u64, String>, String> {
    let mut peers = BTreeMap::new();
    for entry in text.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        let (id, addr) = entry
            .split_once('=')
            .ok_or_else(|| format!("--peers: {entry:?} is not ID=HOST:PORT"))?;
        let id: u64 = id
            .trim()
            .parse()
            .map_err(|_| format!("--peers: {id:?} is not a broker id (a number from 1)"))?;
        if id == 0 {
            return Err("--peers: broker ids start at 1".into());
        }
        let addr = addr
            .trim()
            .trim_start_matches("http://")
            .trim_end_matches('/');
        let port_ok = addr.rsplit_once(':').is_some_and(|(host, port)| {
            !host.is_empty() && port.parse::<u16>().is_ok_and(|p| p > 0)
        });
        if !port_ok {
            return Err(format!(
                "--peers: broker {id}'s address {addr:?} is not HOST:PORT"
            ));
        }
        if peers.insert(id, addr.to_owned()).is_some() {
            return Err(format!("--peers: broker {id} is listed twice"));
        }
    }
    if peers.is_empty() {
        return Err("--peers lists no broker".into());
    }
    if let Some((a, b)) = duplicate_address(&peers) {
        return Err(format!(
            "--peers: brokers {a} and {b} have the same address"
        ));
    }
    Ok(peers)
}

fn duplicate_address(peers: &BTreeMap<u64, String>) -> Option<(u64, u64)> {
    let mut seen: BTreeMap<&str, u64> = BTreeMap::new();
    for (id, addr) in peers {
        if let Some(first) = seen.insert(addr.as_str(), *id) {
            return Some((first, *id));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peers_parse_and_bad_ones_are_named() {
        let s =
            ClusterSettings::parse(2, "1=127.0.0.1:8081, 2=http://127.0.0.1:8082/,3=h:1").unwrap();
        assert_eq!(s.addr(), "127.0.0.1:8082");
        assert_eq!(s.peers.len(), 3);
        for (id, peers, says) in [
            (0, "1=a:1", "--node-id"),
            (4, "1=a:1,2=b:2", "no broker 4"),
            (1, "1=a:1,1=b:2", "listed twice"),
            (1, "1=a:1,2=a:1", "same address"),
            (1, "1=a", "HOST:PORT"),
            (1, "1=a:0", "HOST:PORT"),
            (1, "x=a:1", "broker id"),
            (1, "0=a:1", "start at 1"),
            (1, "", "no broker"),
            (1, "1:a:1", "ID=HOST:PORT"),
        ] {
            let err = ClusterSettings::parse(id, peers).unwrap_err();
            assert!(err.contains(says), "{peers:?}: {err}");
        }
    }
}
