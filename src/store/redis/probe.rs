//! Breaker probes: while a node's circuit breaker is open, one background task per node checks
//! it every probe interval and closes the breaker when it answers (for a Cluster master, on a
//! connection of the probe's own, then through the Cluster connection, which is replaced when
//! it alone stays stuck).

use std::sync::Arc;

use super::breaker::Breaker;
use super::conn::{Conn, Handle, NodeProbe};
use super::slots;
use super::store::Inner;

impl Inner {
    /// Starts the probe of `breaker`'s node, unless one is running.
    pub(super) fn spawn_probe(self: &Arc<Self>, breaker: &Arc<Breaker>, addr: Option<Arc<str>>) {
        // Outside a runtime (a check made from plain code) the next check in one starts it.
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let Some(token) = breaker.claim_probe() else {
            return;
        };
        let weak = Arc::downgrade(self);
        let breaker = breaker.clone();
        let interval = self.probe_interval;
        // A Cluster master is pinged on a connection of the probe's own (see `NodeProbe`).
        let mut node_probe = addr
            .as_deref()
            .and_then(|a| NodeProbe::new(&self.target, a, self.connect_timeout));
        runtime.spawn(async move {
            let _token = token;
            // The key read on the master, for its slot (see `Conn::responsive`).
            let mut probe_key: Option<(u16, String)> = None;
            loop {
                tokio::time::sleep(interval).await;
                let Some(inner) = weak.upgrade() else {
                    return;
                };
                let Ok(handle) = inner.handle() else {
                    continue;
                };
                let mut slot_key = None;
                if let Some(addr) = &addr {
                    // A Cluster master: if it no longer serves any slot (failed over), nothing
                    // is sent to it any more and its breaker can close.
                    inner.refresh_slots(&handle.conn).await;
                    let Some(slot) = inner.slots.map().slot_of(addr) else {
                        breaker.close(&inner.stats);
                        tracing::info!(node = %addr, "redis node no longer serves slots; its circuit breaker closed");
                        return;
                    };
                    if probe_key.as_ref().is_none_or(|(s, _)| *s != slot) {
                        probe_key = Some((slot, slots::probe_key(inner.keys.prefix(), slot)));
                    }
                    slot_key = probe_key.as_ref().map(|(s, k)| (*s, k.as_str()));
                }
                let ok = match &mut node_probe {
                    // The node answers on the probe's own connection: the breaker closes once
                    // the Cluster connection answers too. One that does not is stuck (see
                    // `Links::rebuild`), and is replaced.
                    Some(probe) => {
                        probe.ping(inner.timeout).await
                            && (inner.answers(&handle.conn, slot_key).await
                                || match inner.rebuild(handle.generation).await {
                                    Some(new) => inner.answers(&new.conn, slot_key).await,
                                    None => false,
                                })
                    }
                    None => matches!(
                        tokio::time::timeout(inner.timeout, handle.conn.responsive(None)).await,
                        Ok(true)
                    ),
                };
                if ok {
                    breaker.close(&inner.stats);
                    tracing::info!(
                        node = addr.as_deref(),
                        "redis answered a probe; circuit breaker closed"
                    );
                    return;
                }
            }
        });
    }

    /// Replaces the current runtime's connection `generation` (a Cluster connection that stopped
    /// answering while its nodes answer a probe; see [`Links::rebuild`]) and reads the slot map
    /// on the new one. Returns the new connection's handle, or `None` if that connection was
    /// already replaced or a new one could not be opened.
    async fn rebuild(self: &Arc<Self>, generation: u64) -> Option<Handle> {
        match self.links.rebuild(&self.link_config(), generation) {
            Ok(Some(handle)) => {
                tracing::warn!(
                    "the redis cluster connection stopped answering while its nodes answer; replaced it with a new one"
                );
                self.refresh_slots(&handle.conn).await;
                Some(handle)
            }
            Ok(None) => None,
            Err(e) => {
                tracing::warn!(error = %e, "could not replace the redis cluster connection");
                None
            }
        }
    }

    /// Whether `conn` answers within the connect timeout, for a slot and its probe key (see
    /// [`Conn::responsive`](super::conn::Conn::responsive)).
    async fn answers(&self, conn: &Conn, slot_key: Option<(u16, &str)>) -> bool {
        matches!(
            tokio::time::timeout(self.connect_timeout, conn.responsive(slot_key)).await,
            Ok(true)
        )
    }

    /// Reads the Cluster's slot map again (at most once per probe interval).
    pub(super) async fn refresh_slots(&self, conn: &Conn) {
        self.slots.refresh(conn).await;
    }
}
