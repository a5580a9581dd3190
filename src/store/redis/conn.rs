//! The connection (one multiplexed connection per store and tokio runtime, or the Cluster
//! connection), script calls with `EVALSHA` and a reload on `NOSCRIPT`, the batcher that
//! coalesces concurrent calls, and the Cluster's slot map.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock, Weak};
use std::time::Duration;

use futures_util::stream::{FuturesUnordered, StreamExt};
use redis::aio::MultiplexedConnection;
use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
use redis::{
    AsyncConnectionConfig, Cmd, ConnectionAddr, ErrorKind, RedisError, ServerErrorKind, Value,
};
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use super::script::{pack_args, reply_ints, Group, Ints, LuaScript, Mode};
use super::stats::RedisStats;
use crate::error::{StoreError, StoreErrorKind};

/// Where the store connects, validated at build time.
#[derive(Debug, Clone)]
pub(crate) enum Target {
    Node(redis::Client),
    /// A Cluster: its client, and the first seed node's connection settings (credentials, TLS),
    /// with which a [`NodeProbe`] connects to one node directly.
    Cluster(
        Box<redis::cluster::ClusterClient>,
        Box<redis::ConnectionInfo>,
    ),
}

/// A live connection. Cloning is cheap (both are handles to one multiplexed connection).
#[derive(Clone)]
pub(crate) enum Conn {
    Node(ConnectionManager),
    Cluster(ClusterConnection),
}

impl std::fmt::Debug for Conn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Conn::Node(_) => "Conn::Node",
            Conn::Cluster(_) => "Conn::Cluster",
        })
    }
}

impl Conn {
    /// Connects lazily: nothing is sent until the first command, and a lost connection is
    /// re-established in the background. Must run inside a tokio runtime.
    pub(crate) fn open(target: &Target, connect_timeout: Duration) -> Result<Self, RedisError> {
        match target {
            Target::Node(client) => {
                let config = ConnectionManagerConfig::new()
                    .set_connection_timeout(Some(connect_timeout))
                    .set_number_of_retries(1)
                    .set_min_delay(Duration::from_millis(10))
                    .set_max_delay(Duration::from_millis(200));
                ConnectionManager::new_lazy_with_config(client.clone(), config).map(Conn::Node)
            }
            Target::Cluster(client, _) => {
                let config = redis::cluster::ClusterConfig::new()
                    .set_connection_timeout(connect_timeout)
                    .set_response_timeout(Duration::from_secs(5));
                Ok(Conn::Cluster(
                    client.get_pending_async_connection_with_config(config),
                ))
            }
        }
    }

    /// Whether the connection answers: `ECHO` to the node, or for a Cluster to the master of
    /// `slot` (a slot of the node being probed, which has just answered a [`NodeProbe`]), else
    /// to any node it holds a live connection to (`PING` would go to every master, and fail
    /// while one is down). Routed by slot, the answer is about the connection to the node whose
    /// keys the caller decides for. Sent to any node, about a third of the checks went to
    /// another, stalled master of a 3-master Cluster and timed out, and the probe then replaced
    /// the connection (`tests/hybrid.rs`,
    /// `a_stalled_master_does_not_make_a_healthy_masters_probe_replace_the_connection`).
    ///
    /// A Cluster node is probed with a [`NodeProbe`] first: a command routed to a node the
    /// Cluster connection has no live connection to makes it reconnect to every seed and read
    /// the slot map again, holding every other call meanwhile.
    pub(crate) async fn responsive(&self, slot: Option<u16>) -> bool {
        let mut echo = redis::cmd("ECHO");
        echo.arg("tollgate");
        self.send_to(echo, slot).await.is_ok()
    }

    pub(crate) async fn query(&self, cmd: &Cmd) -> Result<Value, RedisError> {
        let value = match self {
            Conn::Node(c) => c.clone().send_packed_command(cmd).await?,
            Conn::Cluster(c) => c.clone().req_packed_command(cmd).await?,
        };
        // Server errors may arrive as values; surface them as errors.
        value.extract_error()
    }

    /// Runs the script on `groups` with `EVALSHA`, falling back to `EVAL` (which also caches the
    /// script) when the server answers `NOSCRIPT` (after a restart or `SCRIPT FLUSH`).
    pub(crate) async fn eval<'g>(
        &self,
        script: &LuaScript,
        mode: Mode,
        groups: impl Iterator<Item = &'g Group> + Clone,
    ) -> Result<Value, RedisError> {
        self.eval_routed(script, mode, groups, None).await
    }

    /// [`eval`](Self::eval), or with `node` (a Cluster), one call to the master serving slot
    /// `node` whatever the slots of the groups' keys: they travel as arguments (`'n'` in
    /// `driver.lua`), as Redis refuses declared keys of several slots in one call.
    async fn eval_routed<'g>(
        &self,
        script: &LuaScript,
        mode: Mode,
        groups: impl Iterator<Item = &'g Group> + Clone,
        node: Option<u16>,
    ) -> Result<Value, RedisError> {
        let run = |head: &str, body: &str| {
            let mut cmd = redis::cmd(head);
            cmd.arg(body);
            pack_args(&mut cmd, mode, groups.clone(), node.is_some());
            self.send_to(cmd, node)
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
    async fn send_to(&self, cmd: Cmd, node: Option<u16>) -> Result<Value, RedisError> {
        match (self, node) {
            (Conn::Cluster(c), Some(slot)) => {
                let route = RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(
                    Route::new(slot, SlotAddr::Master),
                ));
                c.clone().route_command(cmd, route).await?.extract_error()
            }
            _ => self.query(&cmd).await,
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
        let host = host.to_owned();
        let addr = match seed.addr() {
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
        let client = redis::Client::open(seed.as_ref().clone().set_addr(addr)).ok()?;
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

/// One call waiting in the batcher. The group travels back with the answer, which always comes
/// by `deadline`: the batcher sends no job after its deadline and gives each script call the
/// earliest deadline of its jobs, so callers need no timer of their own.
pub(crate) struct Job {
    pub(crate) group: Group,
    /// The script of the store that sent it: stores reconfigured from one another share the
    /// connection and its batcher, each with its own script.
    pub(crate) script: Arc<LuaScript>,
    pub(crate) deadline: Instant,
    /// The hash slot of the group's keys (Cluster; 0 on a single node).
    pub(crate) slot: u16,
    pub(crate) reply: oneshot::Sender<(Group, Result<Ints, BatchError>)>,
}

/// Why a batched call failed.
#[derive(Debug, Clone)]
pub(crate) enum BatchError {
    Timeout,
    Redis(Arc<RedisError>),
    Invalid(String),
}

/// Coalesces concurrent calls into one script run: while `max_in_flight` batches are on the
/// wire, new calls queue; the next batch takes everything queued (up to `max_batch`), one script
/// call per script among them (one, unless a reconfigured store shares the connection).
///
/// A Cluster has one batcher per master (`node` holds the slot map): its batches go to that
/// master in one call whatever their slots, see [`run_batch`].
fn spawn_batcher(
    conn: Conn,
    stats: RedisStats,
    (max_batch, max_in_flight): (usize, usize),
    node: Option<Arc<SlotCache>>,
) -> mpsc::UnboundedSender<Job> {
    let (tx, mut rx) = mpsc::unbounded_channel::<Job>();
    tokio::spawn(async move {
        let mut in_flight = FuturesUnordered::new();
        let mut open = true;
        while open || !in_flight.is_empty() {
            tokio::select! {
                biased;
                Some(()) = in_flight.next(), if !in_flight.is_empty() => {}
                job = rx.recv(), if open && in_flight.len() < max_in_flight => {
                    let Some(job) = job else {
                        open = false;
                        continue;
                    };
                    let mut jobs = Vec::with_capacity(8);
                    jobs.push(job);
                    while jobs.len() < max_batch {
                        match rx.try_recv() {
                            Ok(job) => jobs.push(job),
                            Err(_) => break,
                        }
                    }
                    // A caller that went away no longer waits, and a job past its deadline is
                    // answered by the failure policy: neither is sent (nor charged).
                    let now = Instant::now();
                    jobs.retain(|j| !j.reply.is_closed());
                    let (late, mut jobs): (Vec<Job>, Vec<Job>) =
                        jobs.into_iter().partition(|j| j.deadline <= now);
                    for job in late {
                        let _ = job.reply.send((job.group, Err(BatchError::Timeout)));
                    }
                    if jobs.is_empty() {
                        continue;
                    }
                    let batch = |script, jobs| {
                        run_batch(conn.clone(), stats.clone(), script, jobs, node.clone())
                    };
                    if jobs.iter().all(|j| same_script(&j.script, &jobs[0].script)) {
                        jobs.shrink_to_fit();
                        let script = jobs[0].script.clone();
                        in_flight.push(batch(script, jobs));
                        continue;
                    }
                    while let Some(first) = jobs.first() {
                        let script = first.script.clone();
                        let (same, rest): (Vec<Job>, Vec<Job>) = jobs
                            .into_iter()
                            .partition(|j| same_script(&j.script, &script));
                        in_flight.push(batch(script, same));
                        jobs = rest;
                    }
                }
                // Unreachable with max_in_flight >= 1 (checked at build time); if it ever is,
                // the task ends and the next request restarts it (see `Batchers::get`).
                else => break,
            }
        }
    });
    tx
}

fn same_script(a: &Arc<LuaScript>, b: &Arc<LuaScript>) -> bool {
    Arc::ptr_eq(a, b) || a.sha() == b.sha()
}

/// The error code `driver.lua` answers a node batch with when one of its keys is not served by
/// the node it ran on (checked for every key before anything is written).
const UNSERVED: &str = "TOLLGATE_UNSERVED";

/// Runs one batch and answers its jobs. With `node` (a Cluster master's batcher) the batch goes
/// to that master in one call; if a key's slot is no longer served there (resharding, failover:
/// the script checks every key before its first write, so nothing was applied), the jobs are
/// sent again slot by slot, each once, routed by their keys (following `MOVED` and `ASK`), and
/// the slot map is read again.
async fn run_batch(
    conn: Conn,
    stats: RedisStats,
    script: Arc<LuaScript>,
    jobs: Vec<Job>,
    node: Option<Arc<SlotCache>>,
) {
    stats.record_batch(jobs.len());
    let route = node.as_ref().map(|_| jobs[0].slot);
    let result = call_batch(&conn, &script, &jobs, route).await;
    match result {
        Err(BatchError::Redis(e)) if route.is_some() && e.code() == Some(UNSERVED) => {
            tracing::debug!(error = %e, "a cluster node no longer serves a slot of its batch; sending it slot by slot");
            stats.add_split_batch();
            if let Some(slots) = node {
                let conn = conn.clone();
                tokio::spawn(async move { slots.refresh(&conn).await });
            }
            let mut rest = jobs;
            let mut parts = Vec::new();
            while let Some(first) = rest.first() {
                let slot = first.slot;
                let (same, other): (Vec<Job>, Vec<Job>) =
                    rest.into_iter().partition(|j| j.slot == slot);
                parts.push(same);
                rest = other;
            }
            let calls = parts.into_iter().map(|jobs| {
                stats.record_batch(jobs.len());
                let (conn, script) = (&conn, &script);
                async move {
                    let result = call_batch(conn, script, &jobs, None).await;
                    answer(jobs, result);
                }
            });
            futures_util::future::join_all(calls).await;
        }
        result => answer(jobs, result),
    }
}

/// One script call for `jobs`, within the earliest of their deadlines: routed by its keys, or
/// to the master of slot `node`.
async fn call_batch(
    conn: &Conn,
    script: &LuaScript,
    jobs: &[Job],
    node: Option<u16>,
) -> Result<Vec<i64>, BatchError> {
    let deadline = jobs
        .iter()
        .map(|j| j.deadline)
        .min()
        .expect("a batch has jobs");
    let mode = if compact(jobs) {
        Mode::Batch
    } else {
        Mode::Check
    };
    let result = tokio::time::timeout_at(
        deadline,
        conn.eval_routed(script, mode, jobs.iter().map(|j| &j.group), node),
    )
    .await;
    match result {
        Ok(Ok(value)) => reply_ints(value).map_err(|e| BatchError::Invalid(e.to_string())),
        Ok(Err(e)) => Err(BatchError::Redis(Arc::new(e))),
        Err(_) => Err(BatchError::Timeout),
    }
}

/// The compact form when every job is one limit at the server's time (the usual case).
fn compact(jobs: &[Job]) -> bool {
    jobs.iter().all(|j| j.group.is_single_at_server_time())
}

/// Answers each job with its part of the batch's reply (or the batch's error).
fn answer(jobs: Vec<Job>, ints: Result<Vec<i64>, BatchError>) {
    let compact = compact(&jobs);
    let ints = match ints {
        Ok(ints) => ints,
        Err(e) => {
            for job in jobs {
                let _ = job.reply.send((job.group, Err(e.clone())));
            }
            return;
        }
    };
    let total = ints.len();
    let mut at = usize::from(compact);
    for job in jobs {
        // A compact reply holds the time once; each group's answer starts with it.
        let (len, part) = if compact {
            let mut buf = [0i64; 6];
            let part = ints.get(at..at + 5).map(|five| {
                buf[0] = ints[0];
                buf[1..].copy_from_slice(five);
                Ints::from_slice(&buf)
            });
            (5, part.flatten())
        } else {
            let len = job.group.reply_len();
            (len, ints.get(at..at + len).and_then(Ints::from_slice))
        };
        at += len;
        let part = part.ok_or_else(|| {
            BatchError::Invalid(format!(
                "batched reply has {total} integers, expected at least {at}"
            ))
        });
        let _ = job.reply.send((job.group, part));
    }
}

/// The batchers of one connection: the single node's, or one per Cluster master (started when
/// a check for it first comes, restarted if found stopped).
pub(crate) struct Batchers {
    conn: Conn,
    stats: RedisStats,
    limits: (usize, usize),
    /// The Cluster's slot map (`None`: a single node).
    slots: Option<Arc<SlotCache>>,
    by_node: RwLock<Vec<(Box<str>, mpsc::UnboundedSender<Job>)>>,
}

impl Batchers {
    /// The batcher for the master at `node` (`""`: the single node). Must run on the
    /// connection's runtime.
    pub(crate) fn get(&self, node: &str) -> mpsc::UnboundedSender<Job> {
        // The common case, a running batcher of a known master, shares the lock.
        {
            let by_node = self.by_node.read().unwrap_or_else(|e| e.into_inner());
            if let Some((_, batcher)) = by_node.iter().find(|(n, _)| &**n == node) {
                if !batcher.is_closed() {
                    return batcher.clone();
                }
            }
        }
        let mut by_node = self.by_node.write().unwrap_or_else(|e| e.into_inner());
        let spawn = || {
            spawn_batcher(
                self.conn.clone(),
                self.stats.clone(),
                self.limits,
                self.slots.clone(),
            )
        };
        match by_node.iter_mut().find(|(n, _)| &**n == node) {
            Some((_, batcher)) => {
                if batcher.is_closed() {
                    self.stats.add_batcher_restart();
                    tracing::error!(
                        node,
                        "the redis batching task stopped; restarting it (its requests were decided by their failure policies)"
                    );
                    *batcher = spawn();
                }
                batcher.clone()
            }
            None => {
                let batcher = spawn();
                by_node.push((node.into(), batcher.clone()));
                batcher
            }
        }
    }
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
        let conn = Conn::open(cfg.target, cfg.connect_timeout).map_err(|e| {
            StoreError::new(
                StoreErrorKind::Unavailable,
                format!("redis connection: {e}"),
            )
        })?;
        let batchers = cfg.batching.map(|limits| {
            Arc::new(Batchers {
                conn: conn.clone(),
                stats: cfg.stats.clone(),
                limits,
                slots: cfg.slots.cloned(),
                by_node: RwLock::new(Vec::new()),
            })
        });
        Ok((conn, batchers))
    }
}

/// The Cluster's slot map as last read, shared by a store, the stores reconfigured from it and
/// their batchers.
pub(crate) struct SlotCache {
    map: RwLock<Arc<SlotMap>>,
    /// When the map was last asked for (ms since `born`), to ask at most once per `every`.
    asked: AtomicU64,
    born: std::time::Instant,
    every: Duration,
    timeout: Duration,
}

impl SlotCache {
    /// An empty map, read again at most once per `every`, each read within `timeout`.
    pub(crate) fn new(every: Duration, timeout: Duration) -> Self {
        Self {
            map: RwLock::default(),
            asked: AtomicU64::new(0),
            born: std::time::Instant::now(),
            every,
            timeout,
        }
    }

    /// The map as last read (empty until then).
    pub(crate) fn map(&self) -> Arc<SlotMap> {
        self.map.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Reads the Cluster's slot map again (at most once per interval).
    pub(crate) async fn refresh(&self, conn: &Conn) {
        let now = u64::try_from(self.born.elapsed().as_millis()).unwrap_or(u64::MAX);
        let last = self.asked.load(Ordering::Relaxed);
        let every = u64::try_from(self.every.as_millis()).unwrap_or(u64::MAX);
        if last != 0 && now.saturating_sub(last) < every {
            return;
        }
        self.asked.store(now.max(1), Ordering::Relaxed);
        match tokio::time::timeout(self.timeout, SlotMap::fetch(conn)).await {
            Ok(Ok(map)) => {
                *self.map.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(map);
            }
            Ok(Err(e)) => tracing::debug!(error = %e, "could not read the cluster slot map"),
            Err(_) => tracing::debug!("reading the cluster slot map timed out"),
        }
    }
}

/// The Cluster's slot map as `CLUSTER SLOTS` reports it: (first slot, last slot, master
/// `host:port`), sorted by first slot.
#[derive(Debug, Default, Clone)]
pub(crate) struct SlotMap {
    ranges: Vec<(u16, u16, String)>,
}

impl SlotMap {
    /// Reads the map from the Cluster.
    pub(crate) async fn fetch(conn: &Conn) -> Result<Self, StoreError> {
        let mut cmd = redis::cmd("CLUSTER");
        cmd.arg("SLOTS");
        let value = conn.query(&cmd).await.map_err(|e| {
            StoreError::new(StoreErrorKind::Unavailable, format!("CLUSTER SLOTS: {e}"))
        })?;
        Self::parse(&value).ok_or_else(|| {
            StoreError::new(
                StoreErrorKind::InvalidResponse,
                "CLUSTER SLOTS: unexpected reply",
            )
        })
    }

    fn parse(value: &Value) -> Option<Self> {
        let Value::Array(entries) = value else {
            return None;
        };
        let mut ranges = Vec::with_capacity(entries.len());
        for e in entries {
            let Value::Array(e) = e else { return None };
            let (Some(Value::Int(a)), Some(Value::Int(b)), Some(Value::Array(master))) =
                (e.first(), e.get(1), e.get(2))
            else {
                return None;
            };
            let host = match master.first()? {
                Value::BulkString(h) => String::from_utf8_lossy(h).into_owned(),
                Value::SimpleString(h) => h.clone(),
                _ => return None,
            };
            let Some(Value::Int(port)) = master.get(1) else {
                return None;
            };
            ranges.push((
                u16::try_from(*a).ok()?,
                u16::try_from(*b).ok()?,
                format!("{host}:{port}"),
            ));
        }
        ranges.sort_unstable();
        Some(Self { ranges })
    }

    /// A slot the master at `addr` serves (its first), or `None` if it serves none.
    pub(crate) fn slot_of(&self, addr: &str) -> Option<u16> {
        self.ranges.iter().find(|r| r.2 == addr).map(|r| r.0)
    }

    /// The master serving `slot`, if known.
    pub(crate) fn node(&self, slot: u16) -> Option<&str> {
        let i = self
            .ranges
            .partition_point(|r| r.0 <= slot)
            .checked_sub(1)?;
        let (a, b, addr) = &self.ranges[i];
        (*a <= slot && slot <= *b).then_some(addr.as_str())
    }
}

/// The Cluster hash slot of a key whose hash tag is `tag` (CRC16-XMODEM mod 16384, as Redis).
pub(crate) fn slot_of_tag(tag: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &b in tag {
        crc ^= u16::from(b) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc & 16383
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
        let target = Target::Node(redis::Client::open("redis://127.0.0.1:1").unwrap());
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
        let node = Target::Node(redis::Client::open("redis://127.0.0.1:1").unwrap());
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

    #[test]
    fn slots_match_redis() {
        // Values from `CLUSTER KEYSLOT`.
        assert_eq!(slot_of_tag(b"foo"), 12182);
        assert_eq!(slot_of_tag(b"123456789"), 12739);
        assert_eq!(slot_of_tag(b""), 0);
    }

    #[test]
    fn slot_map_lookup() {
        let m = SlotMap::parse(&Value::Array(vec![
            Value::Array(vec![
                Value::Int(5461),
                Value::Int(10922),
                Value::Array(vec![
                    Value::BulkString(b"10.0.0.2".to_vec()),
                    Value::Int(7001),
                ]),
            ]),
            Value::Array(vec![
                Value::Int(0),
                Value::Int(5460),
                Value::Array(vec![
                    Value::BulkString(b"10.0.0.1".to_vec()),
                    Value::Int(7000),
                ]),
            ]),
        ]))
        .unwrap();
        assert_eq!(m.node(0), Some("10.0.0.1:7000"));
        assert_eq!(m.node(5460), Some("10.0.0.1:7000"));
        assert_eq!(m.node(5461), Some("10.0.0.2:7001"));
        assert_eq!(m.node(10923), None);
        assert_eq!(m.slot_of("10.0.0.2:7001"), Some(5461));
        assert_eq!(m.slot_of("10.0.0.1:7000"), Some(0));
        assert_eq!(m.slot_of("10.0.0.3:7002"), None);
        assert!(SlotMap::parse(&Value::Okay).is_none());
    }
}
