//! The connection (one multiplexed connection per store, or the Cluster connection), script calls
//! with `EVALSHA` and a reload on `NOSCRIPT`, and the batcher that coalesces concurrent calls.

use std::sync::Arc;
use std::time::Duration;

use futures_util::stream::{FuturesUnordered, StreamExt};
use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, ErrorKind, RedisError, ServerErrorKind, Value};
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use super::script::{pack_args, reply_ints, Group, Ints, LuaScript, Mode};
use super::stats::RedisStats;

/// Where the store connects, validated at build time.
#[derive(Debug, Clone)]
pub(crate) enum Target {
    Node(redis::Client),
    Cluster(Box<redis::cluster::ClusterClient>),
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
            Target::Cluster(client) => {
                let config = redis::cluster::ClusterConfig::new()
                    .set_connection_timeout(connect_timeout)
                    .set_response_timeout(Duration::from_secs(5));
                Ok(Conn::Cluster(
                    client.get_pending_async_connection_with_config(config),
                ))
            }
        }
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
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(script.sha());
        pack_args(&mut cmd, mode, groups.clone());
        match self.query(&cmd).await {
            Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                tracing::debug!("script not cached on the server; sending it with EVAL");
                let mut cmd = redis::cmd("EVAL");
                cmd.arg(script.code());
                pack_args(&mut cmd, mode, groups);
                self.query(&cmd).await
            }
            other => other,
        }
    }
}

/// One call waiting in the batcher. The group travels back with the answer, which always comes
/// by `deadline`: the batcher sends no job after its deadline and gives each script call the
/// earliest deadline of its jobs, so callers need no timer of their own.
pub(crate) struct Job {
    pub(crate) group: Group,
    pub(crate) deadline: Instant,
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
/// wire, new calls queue; the next batch takes everything queued (up to `max_batch`).
pub(crate) fn spawn_batcher(
    conn: Conn,
    script: Arc<LuaScript>,
    stats: RedisStats,
    max_batch: usize,
    max_in_flight: usize,
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
                    jobs.shrink_to_fit();
                    stats.record_batch(jobs.len());
                    in_flight.push(run_batch(conn.clone(), script.clone(), jobs));
                }
            }
        }
    });
    tx
}

async fn run_batch(conn: Conn, script: Arc<LuaScript>, jobs: Vec<Job>) {
    let deadline = jobs
        .iter()
        .map(|j| j.deadline)
        .min()
        .expect("a batch has jobs");
    // The compact form when every job is one limit at the server's time (the usual case).
    let compact = jobs.iter().all(|j| j.group.is_single_at_server_time());
    let mode = if compact { Mode::Batch } else { Mode::Check };
    let result = tokio::time::timeout_at(
        deadline,
        conn.eval(&script, mode, jobs.iter().map(|j| &j.group)),
    )
    .await;
    let ints = match result {
        Ok(Ok(value)) => reply_ints(value).map_err(|e| BatchError::Invalid(e.to_string())),
        Ok(Err(e)) => Err(BatchError::Redis(Arc::new(e))),
        Err(_) => Err(BatchError::Timeout),
    };
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
