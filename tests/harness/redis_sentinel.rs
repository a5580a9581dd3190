//! A primary, its replicas and three Sentinels monitoring them ([`RedisServer`]s on free
//! loopback ports): `sentinel monitor <master> 127.0.0.1 <port> 2`, `down-after-milliseconds
//! 1000`. Ready once every Sentinel names the primary, knows every replica with its link up and
//! knows the other Sentinels (needed to elect a leader for a failover). Killing the primary
//! (SIGKILL) starts a real failover. Every process is killed when the value is dropped.
#![allow(dead_code)]

use std::time::{Duration, Instant};

use super::redis_server::RedisServer;

/// The master name the Sentinels monitor the primary as.
pub const MASTER: &str = "tollgate-primary";

const SENTINELS: usize = 3;

pub struct RedisSentinel {
    /// The nodes: the first is the initial primary, the others its replicas.
    pub nodes: Vec<RedisServer>,
    pub sentinels: Vec<RedisServer>,
    /// The nodes' and the Sentinels' passwords, once [`secure`](Self::secure) set them.
    passwords: Option<(String, String)>,
}

impl RedisSentinel {
    /// A primary with `replicas` replicas and three Sentinels; returns once they are ready.
    pub fn start(replicas: usize) -> Self {
        let primary = RedisServer::start();
        let port = primary.port().to_string();
        let mut nodes = vec![primary];
        for _ in 0..replicas {
            nodes.push(RedisServer::start_with(&[
                "--replicaof",
                "127.0.0.1",
                &port,
            ]));
        }
        let config = format!(
            "sentinel monitor {MASTER} 127.0.0.1 {port} 2\n\
             sentinel down-after-milliseconds {MASTER} 1000\n\
             sentinel failover-timeout {MASTER} 5000\n\
             sentinel parallel-syncs {MASTER} 1\n"
        );
        let sentinels = (0..SENTINELS)
            .map(|_| RedisServer::start_configured(Some(&config), &["--sentinel"]))
            .collect();
        let set = Self {
            nodes,
            sentinels,
            passwords: None,
        };
        set.wait(Duration::from_secs(60), "the sentinels to be ready", |s| {
            s.ready(replicas)
        });
        set
    }

    /// Makes the nodes require `node` (`requirepass`, with `masterauth` for the replicas and
    /// `auth-pass` for the Sentinels) and the Sentinels require `sentinel` (user `default`,
    /// also the password they use with each other).
    pub fn secure(&mut self, node: &str, sentinel: &str) {
        for s in &self.sentinels {
            let _: () = s.cmd(&["SENTINEL", "SET", MASTER, "auth-pass", node]);
        }
        for n in &self.nodes {
            let _: () = n.cmd(&["CONFIG", "SET", "masterauth", node]);
            let _: () = n.cmd(&["CONFIG", "SET", "requirepass", node]);
        }
        let acl = format!(">{sentinel}");
        for s in &self.sentinels {
            let _: () = s.cmd(&["SENTINEL", "CONFIG", "SET", "sentinel-pass", sentinel]);
            let _: () = s.cmd(&["ACL", "SETUSER", "default", "resetpass", &acl]);
        }
        self.passwords = Some((node.to_owned(), sentinel.to_owned()));
    }

    /// Adds a Sentinel user `user` with `password` that may run every command but subscribe to
    /// no channel (`resetchannels`): a store logged in as it never hears `+switch-master`.
    pub fn add_user_without_channels(&self, user: &str, password: &str) {
        let password = format!(">{password}");
        for s in &self.sentinels {
            let _: () = self.cmd(
                s,
                &[
                    "ACL",
                    "SETUSER",
                    user,
                    "on",
                    &password,
                    "+@all",
                    "resetchannels",
                ],
            );
        }
    }

    /// Runs a command on `server` (a node or a Sentinel), with its password once secured.
    pub fn cmd<T: redis::FromRedisValue>(&self, server: &RedisServer, args: &[&str]) -> T {
        self.try_cmd(server, args)
            .unwrap_or_else(|e| panic!("{args:?} on {}: {e}", server.addr()))
    }

    fn try_cmd<T: redis::FromRedisValue>(
        &self,
        server: &RedisServer,
        args: &[&str],
    ) -> redis::RedisResult<T> {
        let sentinel = self.sentinels.iter().any(|s| s.port() == server.port());
        let url = match &self.passwords {
            Some((node, s)) => {
                let password = if sentinel { s } else { node };
                format!("redis://:{password}@{}", server.addr())
            }
            None => server.url(),
        };
        let mut cmd = redis::cmd(args[0]);
        for a in &args[1..] {
            cmd.arg(*a);
        }
        let mut conn =
            redis::Client::open(url)?.get_connection_with_timeout(Duration::from_secs(1))?;
        cmd.query(&mut conn)
    }

    /// The Sentinels as `host:port`, as `RedisBackend::sentinel` takes them.
    pub fn sentinel_addrs(&self) -> Vec<String> {
        self.sentinels.iter().map(RedisServer::addr).collect()
    }

    /// The primary's port as each Sentinel names it (`None`: it does not answer).
    pub fn named_primaries(&self) -> Vec<Option<u16>> {
        self.sentinels
            .iter()
            .map(|s| {
                let addr: Option<(String, u16)> = self
                    .try_cmd(s, &["SENTINEL", "get-master-addr-by-name", MASTER])
                    .ok()?;
                addr.map(|(_, port)| port)
            })
            .collect()
    }

    /// The node the Sentinels agree is the primary.
    pub fn primary(&self) -> &RedisServer {
        let named = self.named_primaries();
        let port = named[0].expect("the first sentinel names a primary");
        assert!(
            named.iter().all(|p| *p == Some(port)),
            "the sentinels disagree: {named:?}"
        );
        self.node(port)
    }

    pub fn node(&self, port: u16) -> &RedisServer {
        self.nodes
            .iter()
            .find(|n| n.port() == port)
            .unwrap_or_else(|| panic!("no node on port {port}"))
    }

    /// SIGKILLs the primary; returns its port.
    pub fn kill_primary(&mut self) -> u16 {
        let port = self.primary().port();
        self.nodes
            .iter_mut()
            .find(|n| n.port() == port)
            .expect("the primary is a node")
            .kill();
        port
    }

    /// Waits (at most `within`) until every Sentinel names a primary other than `old` and that
    /// node answers `ROLE` as a master; returns its port.
    pub fn wait_failover(&self, old: u16, within: Duration) -> u16 {
        let mut promoted = 0;
        self.wait(within, "the failover", |s| {
            let named = s.named_primaries();
            match named[0] {
                Some(p) if p != old && named.iter().all(|n| *n == Some(p)) => {
                    promoted = p;
                    s.cmd::<Vec<redis::Value>>(s.node(p), &["ROLE"]).first()
                        == Some(&redis::Value::BulkString(b"master".to_vec()))
                }
                _ => false,
            }
        });
        promoted
    }

    /// The Sentinels holding a client subscribed to a channel (`CLIENT LIST` shows `sub=1`),
    /// by index; a Sentinel that does not answer holds none.
    pub fn subscribed_sentinels(&self) -> Vec<usize> {
        (0..self.sentinels.len())
            .filter(|&i| {
                self.try_cmd::<String>(&self.sentinels[i], &["CLIENT", "LIST"])
                    .is_ok_and(|list| list.lines().any(|c| c.contains(" sub=1 ")))
            })
            .collect()
    }

    /// Script calls (`EVALSHA` and `EVAL`) `node` has run for its clients since it started
    /// (a replica applies its primary's writes without counting them here).
    pub fn script_calls(&self, node: &RedisServer) -> u64 {
        let info: String = self.cmd(node, &["INFO", "commandstats"]);
        info.lines()
            .filter(|l| l.starts_with("cmdstat_evalsha:") || l.starts_with("cmdstat_eval:"))
            .filter_map(|l| {
                l.split_once("calls=")?
                    .1
                    .split(',')
                    .next()?
                    .parse::<u64>()
                    .ok()
            })
            .sum()
    }

    /// How far the first replica trails the primary, in bytes of the replication stream: an
    /// upper bound, as the replica's offset is read first and the primary's just after.
    pub fn replication_lag_bytes(&self) -> i64 {
        let primary = self.primary();
        let replica = self
            .nodes
            .iter()
            .find(|n| n.port() != primary.port())
            .expect("a replica");
        let offset = |node: &RedisServer, name: &str| -> i64 {
            let info: String = self.cmd(node, &["INFO", "replication"]);
            info.lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or_else(|| panic!("no {name} in {info}"))
        };
        let replica = offset(replica, "slave_repl_offset:");
        offset(primary, "master_repl_offset:") - replica
    }

    fn ready(&self, replicas: usize) -> bool {
        let port = self.nodes[0].port();
        if self.named_primaries().iter().any(|p| *p != Some(port)) {
            return false;
        }
        let links_up = self.nodes[1..].iter().all(|n| {
            let info: String = self.cmd(n, &["INFO", "replication"]);
            info.contains("master_link_status:up")
        });
        links_up
            && self.sentinels.iter().all(|s| {
                let known_replicas: Vec<redis::Value> =
                    self.cmd(s, &["SENTINEL", "replicas", MASTER]);
                let known_sentinels: Vec<redis::Value> =
                    self.cmd(s, &["SENTINEL", "sentinels", MASTER]);
                known_replicas.len() == replicas && known_sentinels.len() == SENTINELS - 1
            })
    }

    /// Polls `done` every 50 ms until it holds; panics after `within`.
    pub fn wait(&self, within: Duration, what: &str, mut done: impl FnMut(&Self) -> bool) {
        let deadline = Instant::now() + within;
        while !done(self) {
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}
