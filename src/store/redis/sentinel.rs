//! A primary found through Redis Sentinel: the Sentinels that monitor it, and per connection a
//! resolver task that asks them for the primary (`SENTINEL get-master-addr-by-name`), checks
//! with `ROLE` that the node it reached is a master, and resolves again when a call loses the
//! connection or meets `READONLY`, and when a Sentinel announces `+switch-master`. Calls that
//! keep timing out on the primary make it ask the Sentinels whether that node is still the
//! primary (it switches only if they name another). A task of its own
//! ([`sentinel_subscription`](super::sentinel_subscription)) keeps a `+switch-master`
//! subscription on one of the Sentinels, moving to another with backoff when it ends; the
//! known primary is kept meanwhile.

use std::fmt;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, Cmd, ErrorKind, RedisError, ServerErrorKind, Value};
use tokio::sync::{mpsc, watch, Notify};
use tokio::time::Instant;

use super::conn::with_addr;
use super::sentinel_subscription::{subscribe_until_closed, Announcement};
use super::stats::RedisStats;

/// The longest pause between two attempts to resolve the primary while none answers.
const MAX_RETRY_DELAY: Duration = Duration::from_millis(200);

/// Consecutive calls that time out on the primary before the resolver asks the Sentinels
/// whether it is still the primary.
const SUSPECT_AFTER: u32 = 3;

/// The shortest pause between two such questions while the calls keep timing out.
const CHECK_INTERVAL: Duration = Duration::from_millis(200);

/// The longest pause between two such questions, reached by doubling while they keep naming
/// the same primary.
const MAX_CHECK_INTERVAL: Duration = Duration::from_secs(2);

/// Where a Sentinel-monitored primary is found, validated at build time.
#[derive(Clone)]
pub(crate) struct SentinelTarget {
    /// One client per Sentinel, with the Sentinels' credentials and TLS settings.
    pub(crate) sentinels: Vec<redis::Client>,
    /// The master name the Sentinels monitor it as.
    pub(crate) master: String,
    /// The node's connection settings (credentials, TLS), at a placeholder address.
    pub(crate) node: redis::ConnectionInfo,
    /// The store's per-call timeout ([`RedisBackend::timeout`](super::RedisBackend::timeout)).
    pub(crate) response_timeout: Duration,
}

/// The master name and the Sentinels' addresses, never their credentials.
impl fmt::Debug for SentinelTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SentinelTarget")
            .field("master", &self.master)
            .field(
                "sentinels",
                &self
                    .sentinels
                    .iter()
                    .map(|s| s.get_connection_info().addr().to_string())
                    .collect::<Vec<_>>(),
            )
            .field("response_timeout", &self.response_timeout)
            .finish()
    }
}

/// The primary as last resolved: its address and a connection to it.
#[derive(Clone)]
struct Primary {
    addr: Arc<str>,
    conn: MultiplexedConnection,
    /// Counts the resolutions: a call that fails on generation `g` asks for a new primary only
    /// while `g` is current, so a burst of failing calls resolves once.
    generation: u64,
}

/// A connection to the primary of a Sentinel-monitored master. Cloning is cheap: clones share
/// the connection and the resolver task, which ends when the last clone is dropped.
#[derive(Clone)]
pub(crate) struct SentinelConn {
    primary: watch::Receiver<Option<Primary>>,
    /// Asks the resolver task to resolve again.
    failed: Arc<Failed>,
    /// How long a call waits for a primary while none is known.
    connect_timeout: Duration,
}

impl SentinelConn {
    /// Starts the resolver task (and its subscription task) on the current tokio runtime;
    /// nothing is awaited here.
    pub(crate) fn open(
        target: &SentinelTarget,
        connect_timeout: Duration,
        stats: &RedisStats,
    ) -> Self {
        let (tx, rx) = watch::channel(None);
        let failed = Arc::new(Failed::default());
        // Room for a `Resubscribed` and a `Switched` behind it, and more.
        let (announced, announcements) = mpsc::channel(8);
        tokio::spawn(subscribe_until_closed(
            target.sentinels.clone(),
            connect_timeout,
            target.master.clone(),
            announced,
        ));
        let resolver = Resolver {
            target: target.clone(),
            connect_timeout,
            stats: stats.clone(),
            primary: tx,
            failed: failed.clone(),
            announcements,
            generation: 0,
            last: None,
            preferred: 0,
            next_check: Instant::now(),
            check_interval: CHECK_INTERVAL,
        };
        tokio::spawn(resolver.run());
        Self {
            primary: rx,
            failed,
            connect_timeout,
        }
    }

    /// Sends `cmd` to the primary (waiting up to the connect timeout while none is known). A
    /// lost connection or `READONLY` (the node was demoted) makes the resolver find the primary
    /// again; the call itself fails, and the failure policy decides it. A call that times out
    /// (or is dropped unanswered: the store's timeout ended it) counts toward asking the
    /// Sentinels whether the node is still the primary.
    pub(crate) async fn query(&self, cmd: &Cmd) -> Result<Value, RedisError> {
        let primary = self.primary().await?;
        let mut pending = Unanswered {
            failed: &self.failed,
            generation: primary.generation,
            armed: true,
        };
        let result = primary
            .conn
            .clone()
            .send_packed_command(cmd)
            .await
            .and_then(Value::extract_error);
        pending.armed = false;
        match &result {
            Err(e) if e.is_timeout() => self.failed.timed_out(primary.generation),
            Err(e) if needs_new_primary(e) => {
                tracing::debug!(primary = %primary.addr, error = %e, "redis primary failed; asking the sentinels again");
                self.failed.report(primary.generation);
            }
            // The node answered (a server error such as `NOSCRIPT` is an answer too).
            _ => self.failed.answered(),
        }
        result
    }

    async fn primary(&self) -> Result<Primary, RedisError> {
        if let Some(primary) = self.primary.borrow().as_ref() {
            return Ok(primary.clone());
        }
        let mut rx = self.primary.clone();
        let wait = rx.wait_for(Option::is_some);
        match tokio::time::timeout(self.connect_timeout, wait).await {
            Ok(Ok(primary)) => Ok(primary.clone().expect("waited for a primary")),
            _ => Err(RedisError::from((
                ErrorKind::Io,
                "no redis primary known: the sentinels named none that answers as a master",
            ))),
        }
    }
}

/// Counts a call dropped before its answer (the store's timeout ended it) as a timeout.
struct Unanswered<'a> {
    failed: &'a Failed,
    generation: u64,
    armed: bool,
}

impl Drop for Unanswered<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.failed.timed_out(self.generation);
        }
    }
}

/// Whether `e` says the node is gone or no longer the primary.
fn needs_new_primary(e: &RedisError) -> bool {
    e.kind() == ErrorKind::Server(ServerErrorKind::ReadOnly)
        || e.is_io_error()
        || e.is_connection_dropped()
        || e.is_unrecoverable_error()
}

/// The resolver task's state.
struct Resolver {
    target: SentinelTarget,
    connect_timeout: Duration,
    stats: RedisStats,
    primary: watch::Sender<Option<Primary>>,
    failed: Arc<Failed>,
    /// From the subscription task.
    announcements: mpsc::Receiver<Announcement>,
    generation: u64,
    /// The primary last found.
    last: Option<Arc<str>>,
    /// The Sentinel asked first: the last one that answered.
    preferred: usize,
    /// When the Sentinels may next be asked whether the primary is still theirs.
    next_check: Instant,
    /// The pause before the check after the next one (see [`Resolver::check`]).
    check_interval: Duration,
}

/// What calls report to the resolver, and its wake-up.
#[derive(Default)]
struct Failed {
    /// The latest generation a call failed on (lost connection, `READONLY`).
    generation: AtomicU64,
    /// Calls that timed out since the last answer, on any generation.
    timeouts: AtomicU32,
    /// The latest generation on which [`SUSPECT_AFTER`] timeouts were reached.
    suspect: AtomicU64,
    wake: Notify,
}

impl Failed {
    fn report(&self, generation: u64) {
        self.generation.fetch_max(generation, Ordering::Relaxed);
        self.wake.notify_one();
    }

    fn timed_out(&self, generation: u64) {
        if self
            .timeouts
            .fetch_add(1, Ordering::Relaxed)
            .saturating_add(1)
            >= SUSPECT_AFTER
        {
            self.suspect.fetch_max(generation, Ordering::Relaxed);
            self.wake.notify_one();
        }
    }

    fn answered(&self) {
        if self.timeouts.load(Ordering::Relaxed) != 0 {
            self.timeouts.store(0, Ordering::Relaxed);
        }
    }
}

/// Why the resolver woke up.
enum Wake {
    /// Find the primary again, making calls wait for it (a call lost the connection or met
    /// `READONLY`, or a Sentinel announced a failover).
    Resolve,
    /// Ask the Sentinels whether the primary is still theirs, keeping it meanwhile (calls time
    /// out on it, or an announcement may have been missed).
    Check,
    /// Nothing to do (a report about a primary already replaced).
    Nothing,
}

impl Resolver {
    async fn run(mut self) {
        if !self.resolve_until_found().await {
            return;
        }
        loop {
            let wake = tokio::select! {
                () = self.failed.wake.notified() => self.reported(),
                () = self.primary.closed() => return,
                announcement = self.announcements.recv() => match announcement {
                    Some(Announcement::Switched) => Wake::Resolve,
                    Some(Announcement::Resubscribed) => Wake::Check,
                    None => return,
                },
            };
            match wake {
                Wake::Nothing => {}
                Wake::Check => {
                    if !self.check().await {
                        return;
                    }
                }
                Wake::Resolve => {
                    // Calls wait for the new primary rather than fail on the old one.
                    self.primary.send_replace(None);
                    if !self.resolve_until_found().await {
                        return;
                    }
                }
            }
        }
    }

    /// What the calls' reports ask for.
    fn reported(&self) -> Wake {
        if self.failed.generation.load(Ordering::Relaxed) >= self.generation {
            Wake::Resolve
        } else if self.failed.suspect.swap(0, Ordering::Relaxed) >= self.generation {
            Wake::Check
        } else {
            Wake::Nothing
        }
    }

    /// Resolves until a primary answers as a master; false once every handle is gone.
    async fn resolve_until_found(&mut self) -> bool {
        let mut delay = Duration::from_millis(10);
        loop {
            if self.primary.is_closed() {
                return false;
            }
            // Announcements made before the Sentinels are asked are in what they answer; one
            // made while they are asked stays queued, and makes the resolver ask again.
            while self.announcements.try_recv().is_ok() {}
            match self.resolve().await {
                Ok((addr, conn)) => {
                    self.install(addr.into(), conn);
                    return true;
                }
                Err(e) => {
                    tracing::debug!(master = %self.target.master, error = %e, "no redis primary yet; asking the sentinels again");
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(MAX_RETRY_DELAY);
                }
            }
        }
    }

    /// Makes `addr` the primary calls use.
    fn install(&mut self, addr: Arc<str>, conn: MultiplexedConnection) {
        if self.generation > 0 {
            self.stats.add_reconnect();
        }
        if self.last.as_ref() != Some(&addr) {
            tracing::info!(master = %self.target.master, primary = %addr, previous = self.last.as_deref(), "redis primary found through the sentinels");
        }
        self.last = Some(addr.clone());
        self.generation += 1;
        self.check_interval = CHECK_INTERVAL;
        self.failed.timeouts.store(0, Ordering::Relaxed);
        self.primary.send_replace(Some(Primary {
            addr,
            conn,
            generation: self.generation,
        }));
    }

    /// Asks every Sentinel which node is the primary and under which configuration epoch
    /// ([`Resolver::named_with_epoch`]). The node named under the latest epoch is the primary:
    /// the Sentinel that led a failover names the promoted node under a later epoch than one
    /// that has not heard of it yet names the old primary. The current primary is kept while it
    /// is named under the latest epoch, or (Sentinels that do not say their epochs) unless more
    /// of those that answer name another node than name it; otherwise the store switches to such
    /// a node once it answers `ROLE` as a master. Checks are at least [`CHECK_INTERVAL`] apart, twice
    /// as far each time one keeps the primary, up to [`MAX_CHECK_INTERVAL`] (back to the
    /// shortest after a switch, or after a quiet stretch), so a primary that keeps timing out
    /// while the Sentinels name it costs each Sentinel one connection per interval, not five a
    /// second. False once every handle is gone.
    async fn check(&mut self) -> bool {
        if Instant::now() > self.next_check + MAX_CHECK_INTERVAL {
            self.check_interval = CHECK_INTERVAL;
        }
        let wait = tokio::time::sleep_until(self.next_check);
        tokio::select! {
            () = wait => {}
            () = self.primary.closed() => return false,
        }
        self.next_check = Instant::now() + self.check_interval;
        self.check_interval = (self.check_interval * 2).min(MAX_CHECK_INTERVAL);
        let asked = self.target.sentinels.iter().map(|sentinel| async {
            tokio::time::timeout(self.connect_timeout, self.named_with_epoch(sentinel))
                .await
                .ok()
                .and_then(Result::ok)
        });
        let named: Vec<_> = futures_util::future::join_all(asked)
            .await
            .into_iter()
            .flatten()
            .collect();
        let current = self.last.clone();
        let others = switch_to(&named, current.as_deref());
        for (host, port) in others {
            let found = tokio::time::timeout(
                self.connect_timeout * 2,
                self.connect_master(host.clone(), port),
            )
            .await;
            match found {
                Ok(Ok(conn)) => {
                    self.install(format!("{host}:{port}").into(), conn);
                    return true;
                }
                Ok(Err(e)) => {
                    tracing::debug!(master = %self.target.master, node = %format!("{host}:{port}"), error = %e, "a node a sentinel names is not the primary (yet)");
                }
                Err(_) => {
                    tracing::debug!(master = %self.target.master, node = %format!("{host}:{port}"), "a node a sentinel names did not answer");
                }
            }
        }
        tracing::debug!(master = %self.target.master, primary = current.as_deref(), answered = named.len(), "the sentinels name no other primary; keeping it");
        true
    }

    /// Asks each Sentinel in turn (the last one that answered first) for the primary, and
    /// connects to the first one named that answers `ROLE` as a master.
    async fn resolve(&mut self) -> Result<(String, MultiplexedConnection), RedisError> {
        let mut last = None;
        let count = self.target.sentinels.len();
        for i in (0..count).map(|i| (self.preferred + i) % count) {
            let sentinel = &self.target.sentinels[i];
            let found = async {
                let (host, port) = self.named_by(sentinel).await?;
                let conn = self.connect_master(host.clone(), port).await?;
                Ok((format!("{host}:{port}"), conn))
            };
            match tokio::time::timeout(self.connect_timeout * 2, found).await {
                Ok(Ok(found)) => {
                    self.preferred = i;
                    return Ok(found);
                }
                Ok(Err(e)) => last = Some(e),
                Err(_) => {
                    last = Some(RedisError::from((
                        ErrorKind::Io,
                        "timed out asking a sentinel for the primary",
                    )))
                }
            }
        }
        Err(last.unwrap_or_else(|| RedisError::from((ErrorKind::Client, "no sentinels"))))
    }

    /// The node `sentinel` names as the primary, and the configuration epoch it names it under
    /// (`config-epoch` of `SENTINEL MASTER`; `None` when the Sentinel does not say, or refuses
    /// the command, and is asked for the address alone).
    async fn named_with_epoch(
        &self,
        sentinel: &redis::Client,
    ) -> Result<((String, u16), Option<u64>), RedisError> {
        let mut conn = connect(sentinel, self.connect_timeout, self.connect_timeout).await?;
        let fields: Result<Vec<String>, RedisError> = redis::cmd("SENTINEL")
            .arg("MASTER")
            .arg(&self.target.master)
            .query_async(&mut conn)
            .await;
        if let Ok(fields) = fields {
            let field = |name: &str| {
                fields
                    .chunks_exact(2)
                    .find(|kv| kv[0] == name)
                    .map(|kv| kv[1].as_str())
            };
            let port = field("port").and_then(|p| p.parse().ok());
            if let (Some(ip), Some(port)) = (field("ip"), port) {
                let epoch = field("config-epoch").and_then(|e| e.parse().ok());
                return Ok(((ip.to_owned(), port), epoch));
            }
        }
        Ok((self.named_by(sentinel).await?, None))
    }

    /// The node `sentinel` names as the primary.
    async fn named_by(&self, sentinel: &redis::Client) -> Result<(String, u16), RedisError> {
        let mut conn = connect(sentinel, self.connect_timeout, self.connect_timeout).await?;
        let addr: Option<(String, u16)> = redis::cmd("SENTINEL")
            .arg("get-master-addr-by-name")
            .arg(&self.target.master)
            .query_async(&mut conn)
            .await?;
        addr.ok_or_else(|| {
            RedisError::from((
                ErrorKind::Client,
                "the sentinel does not monitor this master name",
            ))
        })
    }

    /// A connection to the node at `host:port`, once it answers `ROLE` as a master. Its calls
    /// may take the store's timeout, or the connect timeout if that is longer (the calls made
    /// while connecting); each call of the store bounds itself by the store's timeout.
    async fn connect_master(
        &self,
        host: String,
        port: u16,
    ) -> Result<MultiplexedConnection, RedisError> {
        let node = redis::Client::open(with_addr(&self.target.node, host, port))?;
        let response_timeout = self.target.response_timeout.max(self.connect_timeout);
        let mut conn = connect(&node, self.connect_timeout, response_timeout).await?;
        let role: Value = tokio::time::timeout(self.connect_timeout, async {
            redis::cmd("ROLE").query_async(&mut conn).await
        })
        .await
        .map_err(|_| {
            RedisError::from((ErrorKind::Io, "timed out asking the node for its ROLE"))
        })??;
        if !is_master(&role) {
            return Err(RedisError::from((
                ErrorKind::Client,
                "the node the sentinel named is not a master (yet)",
            )));
        }
        Ok(conn)
    }
}

/// The nodes to switch to, most named first, given what the Sentinels that answered `named`
/// (each node and the configuration epoch it was named under, if said) while `current` is the
/// primary: none while `current` is named under the latest epoch said, or (no epoch said) by at
/// least as many Sentinels as any other node. Only the Sentinels of the latest epoch count, so
/// one that has not heard of a failover neither moves the store back to the old primary nor
/// keeps it there; without epochs, one Sentinel does not outvote the others.
fn switch_to(named: &[((String, u16), Option<u64>)], current: Option<&str>) -> Vec<(String, u16)> {
    let is_current =
        |(host, port): &(String, u16)| current == Some(format!("{host}:{port}").as_str());
    let latest = named.iter().filter_map(|n| n.1).max();
    let named = named
        .iter()
        .filter(|n| latest.is_none() || n.1 == latest)
        .map(|n| &n.0);
    let mut keep = 0;
    let mut others: Vec<((String, u16), usize)> = Vec::new();
    for node in named {
        if is_current(node) {
            keep += 1;
        } else if let Some(o) = others.iter_mut().find(|o| &o.0 == node) {
            o.1 += 1;
        } else {
            others.push((node.clone(), 1));
        }
    }
    others.retain(|o| o.1 > keep);
    others.sort_by_key(|o| std::cmp::Reverse(o.1));
    others.into_iter().map(|o| o.0).collect()
}

async fn connect(
    client: &redis::Client,
    connect_timeout: Duration,
    response_timeout: Duration,
) -> Result<MultiplexedConnection, RedisError> {
    let config = AsyncConnectionConfig::new()
        .set_connection_timeout(Some(connect_timeout))
        .set_response_timeout(Some(response_timeout));
    client
        .get_multiplexed_async_connection_with_config(&config)
        .await
}

/// Whether a `ROLE` reply is a master's (`["master", offset, replicas]`).
fn is_master(role: &Value) -> bool {
    let Value::Array(items) = role else {
        return false;
    };
    match items.first() {
        Some(Value::BulkString(s)) => s.as_slice() == b"master",
        Some(Value::SimpleString(s)) => s == "master",
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_node_named_under_the_latest_epoch_is_the_primary() {
        let node = |port: u16| ("10.0.0.1".to_owned(), port);
        let x = Some("10.0.0.1:1");
        // The leader of a failover names the promoted node under a later epoch: it alone is
        // enough, and two Sentinels that have not heard of it yet do not outvote it.
        let named = [(node(2), Some(8)), (node(1), Some(7)), (node(1), Some(7))];
        assert_eq!(switch_to(&named, x), [node(2)]);
        // A lagging Sentinel naming the old primary under an older epoch does not move the
        // store back to it.
        let named = [(node(2), Some(8)), (node(1), Some(7))];
        assert!(switch_to(&named, Some("10.0.0.1:2")).is_empty());
        // The current primary under the latest epoch is kept.
        let named = [(node(1), Some(8)), (node(1), Some(8)), (node(2), Some(7))];
        assert!(switch_to(&named, x).is_empty());
        // Without epochs: a switch needs more Sentinels naming the node than the primary.
        let named = [(node(2), None), (node(1), None), (node(1), None)];
        assert!(switch_to(&named, x).is_empty());
        let named = [(node(2), None), (node(2), None), (node(1), None)];
        assert_eq!(switch_to(&named, x), [node(2)]);
        // Nobody answered: keep.
        assert!(switch_to(&[], x).is_empty());
    }

    #[test]
    fn a_role_reply_is_a_masters_only_when_it_says_so() {
        let role = |first: Value| Value::Array(vec![first, Value::Int(0), Value::Array(vec![])]);
        assert!(is_master(&role(Value::BulkString(b"master".to_vec()))));
        assert!(!is_master(&role(Value::BulkString(b"slave".to_vec()))));
        assert!(!is_master(&role(Value::BulkString(b"sentinel".to_vec()))));
        assert!(!is_master(&Value::Nil));
    }

    #[test]
    fn repeated_timeouts_make_the_primary_suspect_until_it_answers() {
        let failed = Failed::default();
        for _ in 1..SUSPECT_AFTER {
            failed.timed_out(4);
        }
        assert_eq!(failed.suspect.load(Ordering::Relaxed), 0, "not yet");
        failed.timed_out(4);
        assert_eq!(failed.suspect.load(Ordering::Relaxed), 4);
        // A late timeout on an older primary does not make the current one suspect.
        failed.timed_out(3);
        assert_eq!(failed.suspect.load(Ordering::Relaxed), 4);
        failed.answered();
        failed.suspect.store(0, Ordering::Relaxed);
        failed.timed_out(4);
        assert_eq!(
            failed.suspect.load(Ordering::Relaxed),
            0,
            "an answer starts the count again"
        );
        assert_eq!(failed.generation.load(Ordering::Relaxed), 0, "no resolve");
    }

    #[test]
    fn a_timeout_is_not_a_lost_connection() {
        let timeout = RedisError::from(std::io::Error::from(std::io::ErrorKind::TimedOut));
        assert!(timeout.is_timeout(), "checked before needs_new_primary");
    }

    #[test]
    fn readonly_and_lost_connections_ask_for_a_new_primary() {
        let readonly = RedisError::from((
            ErrorKind::Server(ServerErrorKind::ReadOnly),
            "You can't write against a read only replica.",
        ));
        assert!(needs_new_primary(&readonly));
        let io = RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionReset));
        assert!(needs_new_primary(&io));
        let script = RedisError::from((ErrorKind::Server(ServerErrorKind::NoScript), "NOSCRIPT"));
        assert!(
            !needs_new_primary(&script),
            "NOSCRIPT is answered with EVAL"
        );
    }
}
