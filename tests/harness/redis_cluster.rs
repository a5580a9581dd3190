//! A 3-master Redis Cluster of real `redis-server` processes ([`RedisServer`]s), created with
//! `redis-cli --cluster create`, and the slot each key maps to.
#![allow(dead_code)]

use std::process::Command;
use std::time::{Duration, Instant};

use super::redis_server::{require, RedisServer};

/// A 3-master Redis Cluster, without replicas or with `replicas` per master.
pub struct RedisCluster {
    pub nodes: Vec<RedisServer>,
}

impl RedisCluster {
    pub fn start() -> Self {
        Self::start_with(&[])
    }

    /// A cluster whose nodes get `extra` `redis-server` arguments too.
    pub fn start_with(extra: &[&str]) -> Self {
        Self::start_replicated(0, extra)
    }

    /// 3 masters with `replicas` replicas each (`3 * (1 + replicas)` nodes), whose nodes get
    /// `extra` `redis-server` arguments (a later `--cluster-node-timeout` overrides the 2 s
    /// default). Returns once every node sees every other and each replica's link is up.
    pub fn start_replicated(replicas: usize, extra: &[&str]) -> Self {
        require("redis-cli");
        let mut args = vec![
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            "nodes.conf",
            "--cluster-node-timeout",
            "2000",
        ];
        args.extend_from_slice(extra);
        let count = 3 * (1 + replicas);
        let nodes: Vec<RedisServer> = (0..count).map(|_| RedisServer::start_with(&args)).collect();
        let mut create = Command::new("redis-cli");
        create.arg("--cluster").arg("create");
        for n in &nodes {
            create.arg(n.addr());
        }
        let out = create
            .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
            .output()
            .expect("run redis-cli --cluster create");
        assert!(
            out.status.success(),
            "redis-cli --cluster create failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let cluster = Self { nodes };
        let known = format!("cluster_known_nodes:{count}");
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let ready = cluster.nodes.iter().all(|n| {
                let info: String = n.cmd(&["CLUSTER", "INFO"]);
                let repl: String = n.cmd(&["INFO", "replication"]);
                info.contains("cluster_state:ok")
                    && info.contains(&known)
                    && (repl.contains("role:master") || repl.contains("master_link_status:up"))
            });
            if ready {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the cluster did not become ready"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        cluster
    }

    /// The index in `nodes` of a replica of the master on `port`.
    pub fn replica_of(&self, port: u16) -> usize {
        (0..self.nodes.len())
            .find(|&i| {
                let repl: String = self.nodes[i].cmd(&["INFO", "replication"]);
                repl.contains(&format!("master_port:{port}\r"))
            })
            .expect("the master has a replica")
    }

    /// The indexes in `nodes` of the masters.
    pub fn masters(&self) -> Vec<usize> {
        (0..self.nodes.len())
            .filter(|&i| {
                let repl: String = self.nodes[i].cmd(&["INFO", "replication"]);
                repl.contains("role:master")
            })
            .collect()
    }

    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }

    /// The slot Redis computes for `key`.
    pub fn keyslot(&self, key: &str) -> i64 {
        self.nodes[0].cmd(&["CLUSTER", "KEYSLOT", key])
    }

    /// Keys on all masters.
    pub fn dbsize(&self) -> i64 {
        self.nodes.iter().map(|n| n.cmd::<i64>(&["DBSIZE"])).sum()
    }

    /// All keys matching `pattern`, on every master.
    pub fn keys(&self, pattern: &str) -> Vec<String> {
        self.nodes
            .iter()
            .flat_map(|n| n.cmd::<Vec<String>>(&["KEYS", pattern]))
            .collect()
    }

    /// The node serving `key`'s slot.
    pub fn node_for(&self, key: &str) -> &RedisServer {
        &self.nodes[self.index_for(key)]
    }

    /// The index in `nodes` of the node serving `key`'s slot.
    pub fn index_for(&self, key: &str) -> usize {
        let slot = self.keyslot(key);
        self.nodes
            .iter()
            .find(|n| {
                let myself: String = n.cmd(&["CLUSTER", "MYID"]);
                let nodes: String = n.cmd(&["CLUSTER", "NODES"]);
                nodes.lines().any(|line| {
                    line.starts_with(&myself)
                        && line.split(' ').skip(8).any(|r| {
                            let mut it = r.split('-');
                            match (it.next().and_then(|a| a.parse::<i64>().ok()), it.next()) {
                                (Some(a), Some(b)) => {
                                    b.parse::<i64>().is_ok_and(|b| a <= slot && slot <= b)
                                }
                                (Some(a), None) => a == slot,
                                _ => false,
                            }
                        })
                })
            })
            .map(|n| {
                self.nodes
                    .iter()
                    .position(|m| m.port() == n.port())
                    .unwrap()
            })
            .expect("some node serves every slot")
    }
}
