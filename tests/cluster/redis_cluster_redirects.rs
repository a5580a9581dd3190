//! A slot moved between masters while a store decides its key: the store's own connection per
//! master follows `ASK` (the slot migrating, the key already on the new master) and `MOVED`
//! (the slot moved), and the key's count carries on there. A real 3-master Cluster on
//! loopback; a 3 s store timeout, so no check falls to its failure policy on a busy machine.

use std::time::Duration;

use tollgate::algorithm::AlgorithmKind;
use tollgate::store::redis::{RedisBackend, RedisStore};
use tollgate::store::Backend;
use tollgate::Quota;

use crate::harness::redis_cluster::RedisCluster;
use crate::harness::stores::{one, prefix, spec};

fn store(cluster: &RedisCluster, test: &str, batching: bool) -> (RedisStore, String) {
    let prefix = prefix(test);
    let store = RedisBackend::cluster(cluster.urls())
        .prefix(prefix.clone())
        .batching(batching)
        .timeout(Duration::from_secs(3))
        .build(&[spec(
            "hourly",
            Quota::per_hour(100),
            AlgorithmKind::TokenBucket,
        )])
        .expect("build the cluster store");
    (store, prefix)
}

/// The `remaining` Redis decided for one check of `client`, failing the test on a store error.
async fn remaining(store: &RedisStore, client: &str) -> u64 {
    one(store, client, 1)
        .await
        .expect("decided by Redis, not by the failure policy")
        .remaining()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_migrating_then_moved_slot_is_followed_with_its_count() {
    let cluster = RedisCluster::start();
    for batching in [true, false] {
        let (store, prefix) = store(&cluster, "redirects", batching);
        let client = if batching { "batched" } else { "alone" };
        assert_eq!(remaining(&store, client).await, 99);
        assert_eq!(remaining(&store, client).await, 98);
        let keys = cluster.keys(&format!("{prefix}*"));
        assert_eq!(keys.len(), 1, "one key: {keys:?}");
        let key = &keys[0];
        let slot = cluster.keyslot(key).to_string();
        let from = cluster.index_for(key);
        let to = (from + 1) % cluster.nodes.len();
        let (a, b) = (&cluster.nodes[from], &cluster.nodes[to]);
        let id =
            |n: &crate::harness::redis_server::RedisServer| n.cmd::<String>(&["CLUSTER", "MYID"]);
        let (a_id, b_id) = (id(a), id(b));
        let keys_in = |n: &crate::harness::redis_server::RedisServer| {
            n.cmd::<i64>(&["CLUSTER", "COUNTKEYSINSLOT", &slot])
        };

        // Migrating: the key moves to `b`; `a` answers `ASK` for it, `b` serves it after `ASKING`.
        let _: String = b.cmd(&["CLUSTER", "SETSLOT", &slot, "IMPORTING", &a_id]);
        let _: String = a.cmd(&["CLUSTER", "SETSLOT", &slot, "MIGRATING", &b_id]);
        let port = b.port().to_string();
        let _: String = a.cmd(&["MIGRATE", "127.0.0.1", &port, key, "0", "5000"]);
        assert_eq!(
            remaining(&store, client).await,
            97,
            "batching {batching}: ASK followed to the node holding the key's count"
        );
        assert_eq!(keys_in(a), 0, "nothing written on the old node");

        // Moved: every master says `b` serves the slot; `a` answers `MOVED`.
        for n in [b, a] {
            let _: String = n.cmd(&["CLUSTER", "SETSLOT", &slot, "NODE", &b_id]);
        }
        let other = &cluster.nodes[(from + 2) % cluster.nodes.len()];
        let _: String = other.cmd(&["CLUSTER", "SETSLOT", &slot, "NODE", &b_id]);
        assert_eq!(
            remaining(&store, client).await,
            96,
            "batching {batching}: MOVED followed, the count carried on"
        );
        assert_eq!(remaining(&store, client).await, 95);
        assert_eq!(keys_in(a), 0, "nothing written on the old node");
        assert_eq!(keys_in(b), 1);
    }
}
