//! The `+switch-master` subscription of a Sentinel-monitored primary's resolver
//! ([`sentinel`](super::sentinel)): a task of its own that keeps a subscription on one of the
//! Sentinels and tells the resolver what it announces, moving to the next Sentinel with backoff
//! when the subscription ends, while the resolver keeps the primary it knows.

use std::time::Duration;

use futures_util::StreamExt;
use redis::RedisError;
use tokio::sync::mpsc;

/// The Sentinel channel on which a failover's new primary is announced.
const SWITCH_MASTER: &str = "+switch-master";

/// The first and the longest pause before subscribing to `+switch-master` again after a
/// subscription ended or no Sentinel accepted one.
const RESUBSCRIBE_DELAY: (Duration, Duration) = (Duration::from_millis(50), Duration::from_secs(2));

/// What the subscription task tells the resolver.
#[derive(Debug, Clone, Copy)]
pub(super) enum Announcement {
    /// A Sentinel announced a new primary for the master.
    Switched,
    /// A subscription was set up again after one ended: an announcement may have been missed.
    Resubscribed,
}

/// Keeps a `+switch-master` subscription on one of `sentinels` and tells the resolver what it
/// announces for `master`; when the subscription ends (the Sentinel restarted or died), it
/// subscribes on the next Sentinel that accepts, with a backoff while none does, and tells the
/// resolver it did. Ends when the resolver does.
pub(super) async fn subscribe_until_closed(
    sentinels: Vec<redis::Client>,
    connect_timeout: Duration,
    master: String,
    resolver: mpsc::Sender<Announcement>,
) {
    let (mut next, mut delay, mut ended) = (0, RESUBSCRIBE_DELAY.0, false);
    let count = sentinels.len();
    if count == 0 {
        return;
    }
    loop {
        let subscribed = async {
            for i in (0..count).map(|i| (next + i) % count) {
                let subscribe = async {
                    let mut pubsub = sentinels[i].get_async_pubsub().await?;
                    pubsub.subscribe(SWITCH_MASTER).await?;
                    Ok::<_, RedisError>(pubsub.into_on_message())
                };
                if let Ok(Ok(stream)) = tokio::time::timeout(connect_timeout, subscribe).await {
                    return Some((i, stream));
                }
            }
            None
        };
        let subscribed = tokio::select! {
            s = subscribed => s,
            () = resolver.closed() => return,
        };
        let Some((at, mut stream)) = subscribed else {
            tokio::select! {
                () = tokio::time::sleep(delay) => {}
                () = resolver.closed() => return,
            }
            (delay, ended) = ((delay * 2).min(RESUBSCRIBE_DELAY.1), true);
            continue;
        };
        if ended {
            tracing::debug!(master = %master, sentinel = at, "subscribed to a sentinel's announcements again");
            let _ = resolver.try_send(Announcement::Resubscribed);
        }
        delay = RESUBSCRIBE_DELAY.0;
        loop {
            let msg = tokio::select! {
                msg = stream.next() => msg,
                () = resolver.closed() => return,
            };
            match msg {
                Some(msg) if announces(&msg, &master) => {
                    let _ = resolver.try_send(Announcement::Switched);
                }
                Some(_) => {}
                None => break,
            }
        }
        tracing::debug!(master = %master, sentinel = at, "a sentinel's announcements ended; the known primary is kept while subscribing to another");
        (next, ended) = (at + 1, true);
    }
}

/// Whether `msg` announces a new primary for `master`: `+switch-master` carries
/// `<master name> <old ip> <old port> <new ip> <new port>`.
fn announces(msg: &redis::Msg, master: &str) -> bool {
    msg.get_payload::<String>()
        .is_ok_and(|p| p.split(' ').next() == Some(master))
}
