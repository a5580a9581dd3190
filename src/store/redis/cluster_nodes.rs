//! The store's own connections to a Cluster's masters: one multiplexed connection per master,
//! chosen from the store's slot map ([`SlotCache`]), so that a master that dies or a slot map
//! that changes affects only the calls to that master.
//!
//! redis-rs's Cluster connection refreshes its slot map inline when a node fails, holding every
//! other call meanwhile (0.7–0.8 s measured at a promotion, up to 1.9 s when it wedges). Here a
//! failure on one master (a timeout, a lost or refused connection, `CLUSTERDOWN`, `TRYAGAIN`,
//! `MOVED`) fails only that call and starts a slot-map refresh in the background, asked of every
//! other known node at once and rate-limited by the [`SlotCache`]; the next calls go where the
//! new map says. `MOVED` is followed once to the node it names, `ASK` once with `ASKING`.
//!
//! `TRYAGAIN` (a call whose keys are split between the two nodes of a slot being migrated; Redis
//! ran nothing) is sent again from the start, [`TRYAGAIN_WAITS`] later each time: at most 3
//! tries, 30 ms of waits between them, and only a try that fits before the caller's deadline
//! (the store's timeout). If the keys are still split, the call fails and is decided by the
//! failure policies, as on `CLUSTERDOWN`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::cluster_async::ClusterConnection;
use redis::{AsyncConnectionConfig, Cmd, ErrorKind, RedisError, ServerErrorKind, Value};
use tokio::sync::OnceCell;
use tokio::time::Instant;

use super::conn::{with_addr, Conn};
use super::slots::SlotCache;

/// How long a call may wait for its answer on a master's connection before the connection is
/// dropped (as the redis-rs Cluster connection's default); calls end at their own deadline.
const RESPONSE_TIMEOUT: Duration = Duration::from_secs(5);

/// The waits before each new try of a call answered `TRYAGAIN` (see the module docs).
const TRYAGAIN_WAITS: [Duration; 2] = [Duration::from_millis(10), Duration::from_millis(20)];

/// The time a new try needs before the caller's deadline to be worth sending: a loopback round
/// trip and the script, with room to spare.
const TRYAGAIN_MARGIN: Duration = Duration::from_millis(2);

/// One master's connection, made on first use; replaced when it fails.
type Cell = Arc<OnceCell<MultiplexedConnection>>;

/// A Cluster reached through connections of the store's own (see the module docs), and the
/// redis-rs Cluster connection for the commands that are not one slot's (`SCRIPT LOAD` to every
/// master, `CONFIG GET`) and for slots the map does not know yet.
pub(crate) struct ClusterNodes {
    /// The first seed's settings (credentials, TLS); every node is reached with them.
    seed: redis::ConnectionInfo,
    /// The seed's `host:port`, asked for the slot map when no known node answers.
    seed_addr: Arc<str>,
    slots: Arc<SlotCache>,
    connect_timeout: Duration,
    conns: Mutex<HashMap<String, Cell>>,
    pub(crate) fallback: ClusterConnection,
}

impl std::fmt::Debug for ClusterNodes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterNodes").finish_non_exhaustive()
    }
}

impl ClusterNodes {
    pub(crate) fn new(
        seed: &redis::ConnectionInfo,
        slots: Arc<SlotCache>,
        connect_timeout: Duration,
        fallback: ClusterConnection,
    ) -> Self {
        Self {
            seed_addr: seed.addr().to_string().into(),
            seed: seed.clone(),
            slots,
            connect_timeout,
            conns: Mutex::default(),
            fallback,
        }
    }

    /// Sends `cmd` to the master serving `slot` as the store's map says, following one `MOVED`
    /// or `ASK`; through the fallback connection while the map does not name the slot's master.
    /// A `TRYAGAIN` is tried again after each of [`TRYAGAIN_WAITS`] that leaves
    /// [`TRYAGAIN_MARGIN`] for the try before `deadline` (the caller's); otherwise it is the
    /// answer at once, so the caller's failure policy decides the call rather than its timeout.
    pub(crate) async fn send(
        self: &Arc<Self>,
        cmd: &Cmd,
        slot: u16,
        deadline: Instant,
    ) -> Result<Value, RedisError> {
        let mut waits = TRYAGAIN_WAITS.iter();
        loop {
            match self.send_once(cmd, slot).await {
                Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::TryAgain) => {
                    let Some(wait) = waits
                        .next()
                        .filter(|&&w| Instant::now() + w + TRYAGAIN_MARGIN < deadline)
                    else {
                        return Err(e);
                    };
                    tracing::debug!(slot, ?wait, "keys split by a slot migration; trying again");
                    tokio::time::sleep(*wait).await;
                }
                other => return other,
            }
        }
    }

    async fn send_once(self: &Arc<Self>, cmd: &Cmd, slot: u16) -> Result<Value, RedisError> {
        // The map is held only while the slot is looked up; the address is shared with it.
        let addr = self.slots.map().node(slot).cloned();
        let Some(addr) = addr else {
            self.refresh_in_background();
            let route = redis::cluster_routing::RoutingInfo::SingleNode(
                redis::cluster_routing::SingleNodeRoutingInfo::SpecificNode(
                    redis::cluster_routing::Route::new(
                        slot,
                        redis::cluster_routing::SlotAddr::Master,
                    ),
                ),
            );
            return self
                .fallback
                .clone()
                .route_command(cmd.clone(), route)
                .await?
                .extract_error();
        };
        match self.send_to_node(&addr, cmd, false).await {
            Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::Moved) => {
                let Some((to, _)) = e.redirect_node() else {
                    return Err(e);
                };
                let to = to.to_owned();
                self.refresh_in_background();
                self.send_to_node(&to, cmd, false).await
            }
            Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::Ask) => {
                let Some((to, _)) = e.redirect_node() else {
                    return Err(e);
                };
                let to = to.to_owned();
                self.send_to_node(&to, cmd, true).await
            }
            other => other,
        }
    }

    /// Sends `cmd` (after `ASKING` when `asking`) to the node at `addr`. A failure that says
    /// the node or the map may have changed drops the connection (lost or refused) and starts a
    /// slot-map refresh; the call itself is not retried.
    async fn send_to_node(
        self: &Arc<Self>,
        addr: &str,
        cmd: &Cmd,
        asking: bool,
    ) -> Result<Value, RedisError> {
        let cell = self.cell(addr);
        let result = self.call(&cell, addr, cmd, asking).await;
        if let Err(e) = &result {
            let connection_lost = e.is_io_error()
                || e.is_connection_dropped()
                || e.is_timeout()
                || e.is_unrecoverable_error();
            if connection_lost {
                self.forget(addr, &cell);
            }
            if connection_lost
                || matches!(
                    e.kind(),
                    ErrorKind::Server(ServerErrorKind::ClusterDown)
                        | ErrorKind::Server(ServerErrorKind::TryAgain)
                )
            {
                self.refresh_in_background();
            }
        }
        result
    }

    async fn call(
        &self,
        cell: &Cell,
        addr: &str,
        cmd: &Cmd,
        asking: bool,
    ) -> Result<Value, RedisError> {
        let mut conn = cell.get_or_try_init(|| self.connect(addr)).await?.clone();
        if asking {
            let mut pipe = redis::pipe();
            pipe.cmd("ASKING").ignore().add_command(cmd.clone());
            let mut values: Vec<Value> = pipe.query_async(&mut conn).await?;
            return values
                .pop()
                .ok_or_else(|| {
                    RedisError::from((ErrorKind::UnexpectedReturnType, "no reply after ASKING"))
                })?
                .extract_error();
        }
        conn.send_packed_command(cmd).await?.extract_error()
    }

    /// A new connection to the node at `addr` (`host:port`), within the connect timeout.
    async fn connect(&self, addr: &str) -> Result<MultiplexedConnection, RedisError> {
        let (host, port) = addr
            .rsplit_once(':')
            .and_then(|(h, p)| Some((h, p.parse::<u16>().ok()?)))
            .ok_or_else(|| {
                RedisError::from((
                    ErrorKind::Client,
                    "cluster node address is not host:port",
                    addr.to_owned(),
                ))
            })?;
        let client = redis::Client::open(with_addr(&self.seed, host.to_owned(), port))?;
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(self.connect_timeout))
            .set_response_timeout(Some(RESPONSE_TIMEOUT));
        match tokio::time::timeout(
            self.connect_timeout,
            client.get_multiplexed_async_connection_with_config(&config),
        )
        .await
        {
            Ok(result) => result,
            Err(_) => Err(RedisError::from(std::io::Error::from(
                std::io::ErrorKind::TimedOut,
            ))),
        }
    }

    fn cell(&self, addr: &str) -> Cell {
        let mut conns = self.conns.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(cell) = conns.get(addr) {
            return cell.clone();
        }
        conns.entry(addr.to_owned()).or_default().clone()
    }

    /// Drops the connections to nodes the slot map no longer names as masters (demoted, or
    /// gone across failovers, or named only by a `MOVED` or `ASK`): the store keeps at most one
    /// connection per master of the map, and the seed's.
    fn keep_the_maps_masters(&self) {
        let map = self.slots.map();
        let masters = map.masters();
        let mut conns = self.conns.lock().unwrap_or_else(|e| e.into_inner());
        conns.retain(|addr, _| **addr == *self.seed_addr || masters.iter().any(|m| **m == **addr));
    }

    /// Drops `cell` (the connection to `addr` that failed) unless it was already replaced.
    fn forget(&self, addr: &str, cell: &Cell) {
        let mut conns = self.conns.lock().unwrap_or_else(|e| e.into_inner());
        if conns.get(addr).is_some_and(|c| Arc::ptr_eq(c, cell)) {
            conns.remove(addr);
        }
    }

    /// Reads the slot map again in a background task, if one is due (see [`SlotCache`]).
    fn refresh_in_background(self: &Arc<Self>) {
        if !self.slots.due() {
            return;
        }
        let nodes = self.clone();
        tokio::spawn(async move {
            let conn = Conn::Cluster(nodes.clone());
            nodes.slots.refresh(&conn).await;
            nodes.keep_the_maps_masters();
        });
    }

    /// `CLUSTER SLOTS`, asked of every master the map names and the seed at once, over the
    /// store's own connections: the first answer wins, so a dead node costs nothing.
    pub(crate) async fn cluster_slots(self: &Arc<Self>) -> Result<Value, RedisError> {
        let mut addrs = self.slots.map().masters().to_vec();
        if !addrs.contains(&self.seed_addr) {
            addrs.push(self.seed_addr.clone());
        }
        let mut cmd = redis::cmd("CLUSTER");
        cmd.arg("SLOTS");
        let asks = addrs.iter().map(|addr| {
            let cmd = &cmd;
            Box::pin(async move { self.send_to_node(addr, cmd, false).await })
        });
        match futures_util::future::select_ok(asks).await {
            Ok((value, _)) => Ok(value),
            // No node of the map answers: the fallback connection knows every seed.
            Err(_) => self.fallback.clone().req_packed_command(&cmd).await,
        }
    }
}
