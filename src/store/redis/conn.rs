//! The connections: one multiplexed connection per store and tokio runtime (for a Cluster, one
//! per master, see [`ClusterNodes`]), with its batchers; script calls with `EVALSHA` and a reload on `NOSCRIPT`; and a
//! breaker probe's own connection to one Cluster node.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::{
    AsyncConnectionConfig, Cmd, ConnectionAddr, ErrorKind, RedisError, ServerErrorKind, Value,
};
use tokio::sync::oneshot;
use tokio::time::Instant;

use super::batcher::Batchers;
use super::cluster_nodes::ClusterNodes;
use super::script::{pack_args, CallKind, Group, LuaScript};
use super::sentinel::{SentinelConn, SentinelTarget};
use super::slots::{slot_of_key, SlotCache};
use super::stats::RedisStats;
use crate::error::{StoreError, StoreErrorKind};

/// Where the store connects, validated at build time.
#[derive(Debug, Clone)]
pub(crate) enum Target {
    Node(Box<redis::Client>),
    /// A Cluster: its client, and the first seed node's connection settings (credentials, TLS),
    /// with which a [`NodeProbe`] connects to one node directly.
    Cluster(
        Box<redis::cluster::ClusterClient>,
        Box<redis::ConnectionInfo>,
    ),
    /// A primary found through Sentinels.
    Sentinel(Box<SentinelTarget>),
}

/// A live connection. Cloning is cheap (both are handles to one multiplexed connection).
#[derive(Clone)]
pub(crate) enum Conn {
    Node(ConnectionManager),
    Cluster(Arc<ClusterNodes>),
    Sentinel(SentinelConn),
}

impl std::fmt::Debug for Conn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Conn::Node(_) => "Conn::Node",
            Conn::Cluster(_) => "Conn::Cluster",
            Conn::Sentinel(_) => "Conn::Sentinel",
        })
    }
}

impl Conn {
    /// Connects lazily: nothing is sent until the first command, and a lost connection is
    /// re-established in the background (behind Sentinels: at the primary they name then).
    /// Must run inside a tokio runtime.
    pub(crate) fn open(
        target: &Target,
        connect_timeout: Duration,
        stats: &RedisStats,
        slots: Option<&Arc<SlotCache>>,
    ) -> Result<Self, RedisError> {
        match target {
            Target::Node(client) => {
                let config = ConnectionManagerConfig::new()
                    .set_connection_timeout(Some(connect_timeout))
                    .set_number_of_retries(1)
                    .set_min_delay(Duration::from_millis(10))
                    .set_max_delay(Duration::from_millis(200));
                ConnectionManager::new_lazy_with_config((**client).clone(), config).map(Conn::Node)
            }
            Target::Cluster(client, seed) => {
                let config = redis::cluster::ClusterConfig::new()
                    .set_connection_timeout(connect_timeout)
                    .set_response_timeout(Duration::from_secs(5));
                let fallback = client.get_pending_async_connection_with_config(config);
                let slots = slots.cloned().unwrap_or_else(|| {
                    Arc::new(SlotCache::new(Duration::from_secs(1), connect_timeout))
                });
                Ok(Conn::Cluster(Arc::new(ClusterNodes::new(
                    seed,
                    slots,
                    connect_timeout,
                    fallback,
                ))))
            }
            Target::Sentinel(sentinel) => Ok(Conn::Sentinel(SentinelConn::open(
                sentinel,
                connect_timeout,
                stats,
            ))),
        }
    }

    /// Whether the connection answers: `ECHO` to the node; for a Cluster, `EXISTS` of `key`
    /// (`(slot, key)`: [`probe_key`](super::slots::probe_key), a key of the store's namespace
    /// that no store writes, in a slot of the node being probed, which has just answered a
    /// [`NodeProbe`]) on the master of its slot, else `ECHO` to any node it holds a live
    /// connection to (`PING` would go to every master, and fail while one is down). Routed by
    /// slot, the answer is about the connection to the node whose keys the caller decides for.
    /// Sent to any node, about a third of the checks would go to another, stalled master of a
    /// 3-master Cluster and time out, and the probe would then replace the connection (the
    /// hybrid test `a_stalled_master_does_not_make_a_healthy_masters_probe_replace_the_connection`).
    /// A key, unlike `ECHO`, is refused while the node does not serve its slot: `CLUSTERDOWN`
    /// (the Cluster lost a slot's coverage), `MOVED`, `TRYAGAIN`.
    ///
    /// A Cluster node is probed with a [`NodeProbe`] first, on a connection of the probe's own.
    pub(crate) async fn responsive(&self, slot_key: Option<(u16, &str)>) -> bool {
        // The caller's timeout bounds the probe; a keyed read is not tried again.
        let now = Instant::now();
        match slot_key {
            Some((slot, key)) => {
                let mut exists = redis::cmd("EXISTS");
                exists.arg(key);
                self.send_to(exists, Some(slot), now).await.is_ok()
            }
            None => {
                let mut echo = redis::cmd("ECHO");
                echo.arg("tollgate");
                self.send_to(echo, None, now).await.is_ok()
            }
        }
    }

    pub(crate) async fn query(&self, cmd: &Cmd) -> Result<Value, RedisError> {
        let value = match self {
            Conn::Node(c) => c.clone().send_packed_command(cmd).await?,
            Conn::Cluster(c) => c.fallback.clone().req_packed_command(cmd).await?,
            Conn::Sentinel(c) => return c.query(cmd).await,
        };
        // Server errors may arrive as values; surface them as errors.
        value.extract_error()
    }

    /// Runs the script on `groups` with `EVALSHA`, falling back to `EVAL` (which also caches the
    /// script) when the server answers `NOSCRIPT` (after a restart or `SCRIPT FLUSH`).
    /// `deadline` is when the caller gives up: a Cluster call does not wait to try again past it.
    pub(crate) async fn eval<'g>(
        &self,
        script: &LuaScript,
        kind: CallKind,
        groups: impl Iterator<Item = &'g Group> + Clone,
        deadline: Instant,
    ) -> Result<Value, RedisError> {
        self.eval_routed(script, kind, groups, None, deadline).await
    }

    /// [`eval`](Self::eval), or with `node` (a Cluster), one call to the master serving slot
    /// `node` whatever the slots of the groups' keys: they travel as arguments (`'n'` in
    /// `docs/internals/redis-script.md`), as Redis refuses declared keys of several slots in one call.
    pub(super) async fn eval_routed<'g>(
        &self,
        script: &LuaScript,
        kind: CallKind,
        groups: impl Iterator<Item = &'g Group> + Clone,
        node: Option<u16>,
        deadline: Instant,
    ) -> Result<Value, RedisError> {
        let run = |head: &str, body: &str| {
            let mut cmd = redis::cmd(head);
            cmd.arg(body);
            pack_args(&mut cmd, kind, groups.clone(), node.is_some());
            let slot = match self {
                Conn::Cluster(_) => node.or_else(|| {
                    let key = groups.clone().find_map(|g| g.keys.first())?;
                    Some(slot_of_key(key.as_bytes()))
                }),
                _ => node,
            };
            self.send_to(cmd, slot, deadline)
        };
        match run("EVALSHA", script.sha()).await {
            Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                tracing::debug!("script not cached on the server; sending it with EVAL");
                run("EVAL", script.code()).await
            }
            other => other,
        }
    }

    /// Sends `cmd`: routed by its keys, or (a Cluster) to the master of slot `node`.
    async fn send_to(
        &self,
        cmd: Cmd,
        node: Option<u16>,
        deadline: Instant,
    ) -> Result<Value, RedisError> {
        match (self, node) {
            (Conn::Cluster(c), Some(slot)) => c.send(&cmd, slot, deadline).await,
            _ => self.query(&cmd).await,
        }
    }

    /// `CLUSTER SLOTS` (`cmd`): for a Cluster, asked of its nodes directly (see
    /// [`ClusterNodes::cluster_slots`]).
    pub(crate) async fn cluster_slots(&self, cmd: &Cmd) -> Result<Value, RedisError> {
        match self {
            Conn::Cluster(c) => c.cluster_slots().await,
            _ => self.query(cmd).await,
        }
    }
}

/// A circuit-breaker probe's own connection to one Cluster node, outside the Cluster
/// connection: that connection, asked for a node it cannot reach (a dead master), reconnects to
/// every seed node and reads the slot map again while every other call waits, so probing a dead
/// master through it every probe interval would stall the healthy masters' calls too.
pub(crate) struct NodeProbe {
    client: redis::Client,
    conn: Option<MultiplexedConnection>,
    connect_timeout: Duration,
}

impl NodeProbe {
    /// A probe of the Cluster node at `addr` (`host:port`, as `CLUSTER SLOTS` names it), with
    /// the seed node's credentials and TLS settings; `None` for a single node or an address
    /// that is not `host:port`.
    pub(crate) fn new(target: &Target, addr: &str, connect_timeout: Duration) -> Option<Self> {
        let Target::Cluster(_, seed) = target else {
            return None;
        };
        let (host, port) = addr.rsplit_once(':')?;
        let port: u16 = port.parse().ok()?;
        let client = redis::Client::open(with_addr(seed, host.to_owned(), port)).ok()?;
        Some(Self {
            client,
            conn: None,
            connect_timeout,
        })
    }

    /// Whether the node answers `PING` within `timeout` (connecting first, within the connect
    /// timeout, when the probe holds no connection). A failed probe drops its connection.
    pub(crate) async fn ping(&mut self, timeout: Duration) -> bool {
        let mut conn = match self.conn.take() {
            Some(conn) => conn,
            None => {
                let config = AsyncConnectionConfig::new()
                    .set_connection_timeout(Some(self.connect_timeout))
                    .set_response_timeout(Some(timeout));
                let connect = self
                    .client
                    .get_multiplexed_async_connection_with_config(&config);
                match tokio::time::timeout(self.connect_timeout, connect).await {
                    Ok(Ok(conn)) => conn,
                    _ => return false,
                }
            }
        };
        let ping = redis::cmd("PING");
        let answered = tokio::time::timeout(timeout, conn.send_packed_command(&ping)).await;
        let ok = matches!(answered, Ok(Ok(v)) if !matches!(v, Value::ServerError(_)));
        if ok {
            self.conn = Some(conn);
        }
        ok
    }
}

/// `info`'s settings (credentials, TLS) for the node at `host:port`.
pub(crate) fn with_addr(
    info: &redis::ConnectionInfo,
    host: String,
    port: u16,
) -> redis::ConnectionInfo {
    let addr = match info.addr() {
        ConnectionAddr::TcpTls {
            insecure,
            tls_params,
            ..
        } => ConnectionAddr::TcpTls {
            host,
            port,
            insecure: *insecure,
            tls_params: tls_params.clone(),
        },
        _ => ConnectionAddr::Tcp(host, port),
    };
    info.clone().set_addr(addr)
}

/// The most runtimes a store keeps a connection for at once (the oldest is dropped beyond).
const MAX_RUNTIMES: usize = 8;

/// A connection, and its batchers, for one tokio runtime. Both live on that runtime: its tasks
/// run the connection and the batchers, and are gone when it shuts down.
struct Link {
    runtime: tokio::runtime::Id,
    /// Alive while the runtime runs: held by a sentinel task on it.
    alive: Weak<()>,
    /// Ends the sentinel task when the link is dropped.
    _stop: oneshot::Sender<()>,
    conn: Conn,
    batchers: Option<Arc<Batchers>>,
    /// Which connection of this runtime it is (see [`Links::rebuild`]).
    generation: u64,
}

/// What a call needs: the connection of the current runtime and its batchers.
pub(crate) struct Handle {
    pub(crate) conn: Conn,
    pub(crate) batchers: Option<Arc<Batchers>>,
    /// The connection's generation, for [`Links::rebuild`].
    pub(crate) generation: u64,
}

/// The store's connections, one per tokio runtime it is used from. A store built (or first used)
/// in one runtime and then used in another gets a connection of its own there, instead of
/// calling into tasks of a runtime that is gone or not running; a batcher that stopped (it
/// panicked) is restarted.
#[derive(Default)]
pub(crate) struct Links {
    links: Mutex<Vec<Link>>,
    connected_once: AtomicBool,
    /// The last generation handed out.
    generations: AtomicU64,
}

/// How a store connects.
pub(crate) struct LinkConfig<'a> {
    pub(crate) target: &'a Target,
    pub(crate) connect_timeout: Duration,
    pub(crate) batching: Option<(usize, usize)>,
    pub(crate) stats: &'a RedisStats,
    /// The Cluster's slot map (`None`: a single node).
    pub(crate) slots: Option<&'a Arc<SlotCache>>,
}

impl Links {
    /// The connection (and batchers) for the current tokio runtime; the bool is true when it was
    /// just set up.
    pub(crate) fn get(&self, cfg: &LinkConfig<'_>) -> Result<(Handle, bool), StoreError> {
        let runtime = tokio::runtime::Handle::try_current().map_err(|_| {
            StoreError::new(
                StoreErrorKind::Other,
                "a Redis store must be used inside a tokio runtime",
            )
        })?;
        let id = runtime.id();
        let mut links = self.links.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(link) = links.iter().find(|l| l.runtime == id) {
            return Ok((
                Handle {
                    conn: link.conn.clone(),
                    batchers: link.batchers.clone(),
                    generation: link.generation,
                },
                false,
            ));
        }
        // Runtimes that shut down took their connections with them.
        links.retain(|l| l.alive.strong_count() > 0);
        if links.len() >= MAX_RUNTIMES {
            links.remove(0);
        }
        let (conn, batchers) = self.connect(cfg)?;
        let token = Arc::new(());
        let alive = Arc::downgrade(&token);
        let (stop, stopped) = oneshot::channel::<()>();
        runtime.spawn(async move {
            let _token = token;
            let _ = stopped.await;
        });
        if self.connected_once.swap(true, Ordering::Relaxed) {
            cfg.stats.add_reconnect();
            tracing::info!(
                runtimes = links.len() + 1,
                "redis store used from another tokio runtime; connecting there"
            );
        }
        let generation = self.generations.fetch_add(1, Ordering::Relaxed) + 1;
        let handle = Handle {
            conn: conn.clone(),
            batchers: batchers.clone(),
            generation,
        };
        links.push(Link {
            runtime: id,
            alive,
            _stop: stop,
            conn,
            batchers,
            generation,
        });
        Ok((handle, true))
    }

    /// Replaces the current runtime's connection of generation `generation` (and its batchers)
    /// with a new one, and returns a handle to it; `None` when that connection was already
    /// replaced (another probe saw it first) or the runtime has none.
    ///
    /// For a Cluster connection that no longer answers while its nodes do: the Cluster client
    /// (`redis` 1.8) can stop answering for good after a master dies under load (a slot refresh
    /// it starts never completes, and it dispatches nothing meanwhile), and nothing repairs it
    /// from outside. Calls still waiting on the old connection end at their deadlines, its
    /// batchers stop once their queues are empty, and its task ends with its last handle.
    pub(crate) fn rebuild(
        &self,
        cfg: &LinkConfig<'_>,
        generation: u64,
    ) -> Result<Option<Handle>, StoreError> {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return Ok(None);
        };
        let id = runtime.id();
        let mut links = self.links.lock().unwrap_or_else(|e| e.into_inner());
        let Some(link) = links
            .iter_mut()
            .find(|l| l.runtime == id && l.generation == generation)
        else {
            return Ok(None);
        };
        let (conn, batchers) = self.connect(cfg)?;
        link.conn = conn;
        link.batchers = batchers;
        link.generation = self.generations.fetch_add(1, Ordering::Relaxed) + 1;
        cfg.stats.add_reconnect();
        Ok(Some(Handle {
            conn: link.conn.clone(),
            batchers: link.batchers.clone(),
            generation: link.generation,
        }))
    }

    /// A new connection, and its batchers, on the current runtime.
    fn connect(&self, cfg: &LinkConfig<'_>) -> Result<(Conn, Option<Arc<Batchers>>), StoreError> {
        let conn =
            Conn::open(cfg.target, cfg.connect_timeout, cfg.stats, cfg.slots).map_err(|e| {
                StoreError::new(
                    StoreErrorKind::Unavailable,
                    format!("redis connection: {e}"),
                )
            })?;
        let batchers = cfg.batching.map(|limits| {
            Arc::new(Batchers::new(
                conn.clone(),
                cfg.stats.clone(),
                limits,
                cfg.slots.cloned(),
            ))
        });
        Ok((conn, batchers))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs `test` on a current-thread runtime with the links to a single node (one that refuses
    /// connections), batching as `batching`, and their stats.
    fn with_node_links(
        batching: (usize, usize),
        test: impl AsyncFnOnce(&LinkConfig<'_>, &Links, &RedisStats),
    ) {
        let target = Target::Node(Box::new(
            redis::Client::open("redis://127.0.0.1:1").unwrap(),
        ));
        let stats = RedisStats::default();
        let cfg = LinkConfig {
            target: &target,
            connect_timeout: Duration::from_millis(10),
            batching: Some(batching),
            stats: &stats,
            slots: None,
        };
        let links = Links::default();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(test(&cfg, &links, &stats));
    }

    #[test]
    fn a_stopped_batcher_is_restarted_and_counted() {
        // max_in_flight 0 (refused by the builder) makes the task end at once: a stand-in for a
        // batcher that panicked.
        with_node_links((64, 0), async |cfg, links, stats| {
            let (first, fresh) = links.get(cfg).unwrap();
            assert!(fresh);
            let batcher = first.batchers.expect("batching on").get("");
            for _ in 0..100 {
                if batcher.is_closed() {
                    break;
                }
                tokio::task::yield_now().await;
            }
            assert!(batcher.is_closed(), "the task ended");
            let (again, fresh) = links.get(cfg).unwrap();
            assert!(!fresh, "same runtime, same connection");
            let restarted = again.batchers.unwrap().get("");
            assert_eq!(stats.batcher_restarts(), 1);
            assert!(!restarted.is_closed(), "a new task took over");
        });
    }

    #[test]
    fn a_node_probe_connects_to_its_node_with_the_seeds_credentials() {
        let seed = "redis://user:secret@10.0.0.1:7000/";
        let client = redis::cluster::ClusterClient::new(vec![seed]).unwrap();
        let info = redis::IntoConnectionInfo::into_connection_info(seed).unwrap();
        let target = Target::Cluster(Box::new(client), Box::new(info));
        let probe = NodeProbe::new(&target, "10.0.0.2:7001", Duration::from_millis(10)).unwrap();
        let info = probe.client.get_connection_info();
        assert_eq!(
            info.addr(),
            &ConnectionAddr::Tcp("10.0.0.2".into(), 7001),
            "the probed node, not the seed"
        );
        assert_eq!(info.redis_settings().username(), Some("user"));
        assert_eq!(info.redis_settings().password(), Some("secret"));
        // IPv6 as `CLUSTER SLOTS` names it; no probe for what is not host:port, nor for a node.
        assert!(NodeProbe::new(&target, "::1:7002", Duration::from_millis(10)).is_some());
        assert!(NodeProbe::new(&target, "10.0.0.2", Duration::from_millis(10)).is_none());
        let node = Target::Node(Box::new(
            redis::Client::open("redis://127.0.0.1:1").unwrap(),
        ));
        assert!(NodeProbe::new(&node, "127.0.0.1:1", Duration::from_millis(10)).is_none());
    }

    #[test]
    fn a_connection_is_rebuilt_once_per_generation() {
        with_node_links((64, 4), async |cfg, links, stats| {
            let (first, _) = links.get(cfg).unwrap();
            let rebuilt = links
                .rebuild(cfg, first.generation)
                .unwrap()
                .expect("rebuilt");
            assert_ne!(rebuilt.generation, first.generation);
            assert!(
                links.rebuild(cfg, first.generation).unwrap().is_none(),
                "a second probe that saw the old connection does not replace the new one"
            );
            let (now, fresh) = links.get(cfg).unwrap();
            assert!(!fresh);
            assert_eq!(
                now.generation, rebuilt.generation,
                "calls use the new connection"
            );
            assert_eq!(stats.reconnects(), 1);
        });
    }
}
