//! A primary found through Redis Sentinel: the Sentinels that monitor it, and per connection a
//! resolver task that asks them for the primary (`SENTINEL get-master-addr-by-name`), checks
//! with `ROLE` that the node it reached is a master, and resolves again when a call loses the
//! connection or meets `READONLY`, and when a Sentinel announces `+switch-master`.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, Cmd, ErrorKind, RedisError, ServerErrorKind, Value};
use tokio::sync::{watch, Notify};

use super::conn::with_addr;
use super::stats::RedisStats;

/// The Sentinel channel on which a failover's new primary is announced.
const SWITCH_MASTER: &str = "+switch-master";

/// The longest pause between two attempts to resolve the primary while none answers.
const MAX_RETRY_DELAY: Duration = Duration::from_millis(200);

/// Where a Sentinel-monitored primary is found, validated at build time.
#[derive(Clone)]
pub(crate) struct SentinelTarget {
    /// One client per Sentinel, with the Sentinels' credentials and TLS settings.
    pub(crate) sentinels: Vec<redis::Client>,
    /// The master name the Sentinels monitor it as.
    pub(crate) master: String,
    /// The node's connection settings (credentials, TLS), at a placeholder address.
    pub(crate) node: redis::ConnectionInfo,
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
    /// Starts the resolver task on the current tokio runtime; nothing is awaited here.
    pub(crate) fn open(
        target: &SentinelTarget,
        connect_timeout: Duration,
        stats: &RedisStats,
    ) -> Self {
        let (tx, rx) = watch::channel(None);
        let failed = Arc::new(Failed::default());
        let resolver = Resolver {
            target: target.clone(),
            connect_timeout,
            stats: stats.clone(),
            primary: tx,
            failed: failed.clone(),
            generation: 0,
            last: None,
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
    /// again; the call itself fails, and the failure policy decides it.
    pub(crate) async fn query(&self, cmd: &Cmd) -> Result<Value, RedisError> {
        let primary = self.primary().await?;
        let result = primary
            .conn
            .clone()
            .send_packed_command(cmd)
            .await
            .and_then(Value::extract_error);
        if let Err(e) = &result
            && needs_new_primary(e)
        {
            tracing::debug!(primary = %primary.addr, error = %e, "redis primary failed; asking the sentinels again");
            self.failed.report(primary.generation);
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
    generation: u64,
    /// The primary last found.
    last: Option<Arc<str>>,
}

/// The latest generation a call failed on, and the resolver's wake-up.
#[derive(Default)]
struct Failed {
    generation: AtomicU64,
    wake: Notify,
}

impl Failed {
    fn report(&self, generation: u64) {
        self.generation.fetch_max(generation, Ordering::Relaxed);
        self.wake.notify_one();
    }
}

/// Why the resolver woke up.
enum Wake {
    /// A call failed (on the current primary, or on one already replaced).
    Failed,
    /// A Sentinel announced a new primary for the master (or the subscription ended, and one
    /// may have been missed).
    Switched,
    /// Every connection handle was dropped.
    Closed,
}

impl Resolver {
    async fn run(mut self) {
        let mut announcements: Option<redis::aio::PubSubStream> = None;
        loop {
            if !self.resolve_until_found().await {
                return;
            }
            if announcements.is_none() {
                announcements = self.subscribe().await;
            }
            // Wait for a reason to resolve again.
            loop {
                let wake = match announcements.as_mut() {
                    Some(stream) => tokio::select! {
                        () = self.failed.wake.notified() => Wake::Failed,
                        () = self.primary.closed() => Wake::Closed,
                        msg = stream.next() => match msg {
                            Some(msg) if announces(&msg, &self.target.master) => Wake::Switched,
                            Some(_) => continue,
                            None => {
                                announcements = None;
                                Wake::Switched
                            }
                        },
                    },
                    None => tokio::select! {
                        () = self.failed.wake.notified() => Wake::Failed,
                        () = self.primary.closed() => Wake::Closed,
                        // Without a subscription, try to subscribe again now and then.
                        () = tokio::time::sleep(self.connect_timeout.max(MAX_RETRY_DELAY)) => {
                            announcements = self.subscribe().await;
                            continue;
                        }
                    },
                };
                match wake {
                    Wake::Closed => return,
                    Wake::Failed
                        if self.failed.generation.load(Ordering::Relaxed) < self.generation =>
                    {
                        continue;
                    }
                    Wake::Failed | Wake::Switched => break,
                }
            }
            // Calls wait for the new primary rather than fail on the old one.
            self.primary.send_replace(None);
        }
    }

    /// Resolves until a primary answers as a master; false once every handle is gone.
    async fn resolve_until_found(&mut self) -> bool {
        let mut delay = Duration::from_millis(10);
        loop {
            if self.primary.is_closed() {
                return false;
            }
            match self.resolve().await {
                Ok((addr, conn)) => {
                    let addr: Arc<str> = addr.into();
                    if self.generation > 0 {
                        self.stats.add_reconnect();
                    }
                    if self.last.as_ref() != Some(&addr) {
                        tracing::info!(master = %self.target.master, primary = %addr, previous = self.last.as_deref(), "redis primary found through the sentinels");
                    }
                    self.last = Some(addr.clone());
                    self.generation += 1;
                    self.primary.send_replace(Some(Primary {
                        addr,
                        conn,
                        generation: self.generation,
                    }));
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

    /// Asks each Sentinel in turn for the primary, and connects to the first one named that
    /// answers `ROLE` as a master.
    async fn resolve(&self) -> Result<(String, MultiplexedConnection), RedisError> {
        let mut last = None;
        for sentinel in &self.target.sentinels {
            let found = async {
                let mut conn = self.connect(sentinel).await?;
                let addr: Option<(String, u16)> = redis::cmd("SENTINEL")
                    .arg("get-master-addr-by-name")
                    .arg(&self.target.master)
                    .query_async(&mut conn)
                    .await?;
                let Some((host, port)) = addr else {
                    return Err(RedisError::from((
                        ErrorKind::Client,
                        "the sentinel does not monitor this master name",
                    )));
                };
                let node = redis::Client::open(with_addr(&self.target.node, host.clone(), port))?;
                let mut conn = self.connect(&node).await?;
                let role: Value = redis::cmd("ROLE").query_async(&mut conn).await?;
                if !is_master(&role) {
                    return Err(RedisError::from((
                        ErrorKind::Client,
                        "the node the sentinel named is not a master (yet)",
                    )));
                }
                Ok((format!("{host}:{port}"), conn))
            };
            match tokio::time::timeout(self.connect_timeout * 2, found).await {
                Ok(Ok(found)) => return Ok(found),
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

    async fn connect(&self, client: &redis::Client) -> Result<MultiplexedConnection, RedisError> {
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(self.connect_timeout))
            .set_response_timeout(Some(self.connect_timeout));
        client
            .get_multiplexed_async_connection_with_config(&config)
            .await
    }

    /// A subscription to `+switch-master` on the first Sentinel that accepts one.
    async fn subscribe(&self) -> Option<redis::aio::PubSubStream> {
        for sentinel in &self.target.sentinels {
            let subscribed = async {
                let mut pubsub = sentinel.get_async_pubsub().await?;
                pubsub.subscribe(SWITCH_MASTER).await?;
                Ok::<_, RedisError>(pubsub.into_on_message())
            };
            if let Ok(Ok(stream)) = tokio::time::timeout(self.connect_timeout, subscribed).await {
                return Some(stream);
            }
        }
        None
    }
}

/// Whether `msg` announces a new primary for `master`: `+switch-master` carries
/// `<master name> <old ip> <old port> <new ip> <new port>`.
fn announces(msg: &redis::Msg, master: &str) -> bool {
    msg.get_payload::<String>()
        .is_ok_and(|p| p.split(' ').next() == Some(master))
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
    fn a_role_reply_is_a_masters_only_when_it_says_so() {
        let role = |first: Value| Value::Array(vec![first, Value::Int(0), Value::Array(vec![])]);
        assert!(is_master(&role(Value::BulkString(b"master".to_vec()))));
        assert!(!is_master(&role(Value::BulkString(b"slave".to_vec()))));
        assert!(!is_master(&role(Value::BulkString(b"sentinel".to_vec()))));
        assert!(!is_master(&Value::Nil));
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
