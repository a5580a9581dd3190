//! [`RedisBackend`]'s Sentinel settings: the Sentinels, the master name they monitor the
//! primary as, and the Sentinels' own credentials, checked at build time into a
//! [`SentinelTarget`] (the resolver that uses it: [`sentinel`](super::sentinel)).

use super::backend::{redact_url, Credentials, RedisBackend, TargetSpec};
use super::sentinel::SentinelTarget;
use crate::error::ConfigError;

impl RedisBackend {
    /// The primary of `master`, found through `sentinels` (`host:port`, or `redis://host:port` /
    /// `rediss://host:port` URLs; any subset of the Sentinels that monitor it): the store asks
    /// them which node is the primary, checks with `ROLE` that the node it reaches is a master,
    /// and asks again when it loses the connection, when the node answers `READONLY`, when
    /// a Sentinel announces a failover (`+switch-master`), and when calls keep timing out on
    /// the primary (then it switches only if the Sentinels name another node). Calls take the
    /// store's [`timeout`](Self::timeout); while the Sentinels are unreachable the known primary
    /// is kept. The primary is authenticated with
    /// [`credentials`](Self::credentials), the Sentinels with
    /// [`sentinel_credentials`](Self::sentinel_credentials) (or credentials in their URLs); with
    /// `rediss://` Sentinels the primary is reached over TLS too, with the same
    /// certificates. What a failover costs: [Sentinel](crate::guide::redis#sentinel).
    ///
    /// ```
    /// use tollgate::store::redis::RedisBackend;
    ///
    /// let backend = RedisBackend::sentinel(["10.0.0.1:26379", "10.0.0.2:26379"], "mymaster")
    ///     .credentials("tollgate", "node-password")
    ///     .sentinel_credentials("default", "sentinel-password");
    /// assert!(!format!("{backend:?}").contains("password"));
    /// ```
    pub fn sentinel<I, S>(sentinels: I, master: impl Into<String>) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Self::with_target(TargetSpec::Sentinel(
            sentinels.into_iter().map(Into::into).collect(),
            master.into(),
        ))
    }

    /// Authenticates to the Sentinels (not the primary) as `username` with `password`: for
    /// Sentinels configured with `requirepass` (user `"default"`) or an ACL user. Credentials in
    /// a Sentinel's URL take precedence. Never printed.
    pub fn sentinel_credentials(
        mut self,
        username: impl Into<String>,
        password: impl Into<String>,
    ) -> Self {
        self.sentinel_credentials = Some(Credentials {
            username: username.into(),
            password: password.into(),
        });
        self
    }
}

impl RedisBackend {
    /// The Sentinels' clients and the primary's settings; a [`ConfigError`] for no Sentinels, an
    /// empty master name or an address that is neither `host:port` nor a Redis URL.
    pub(super) fn sentinel_target(
        &self,
        sentinels: &[String],
        master: &str,
    ) -> Result<SentinelTarget, ConfigError> {
        const FIELD: &str = "redis.sentinel";
        if sentinels.is_empty() {
            return Err(ConfigError::new(
                FIELD,
                "no sentinels given; pass at least one host:port, e.g. \"10.0.0.1:26379\"",
            ));
        }
        if master.trim().is_empty() {
            return Err(ConfigError::new(
                "redis.sentinel.master",
                "the master name is empty; use the name the sentinels monitor the primary as (`sentinel monitor <name> ...`), e.g. \"mymaster\"",
            ));
        }
        let clients = sentinels
            .iter()
            .map(|addr| {
                let url = sentinel_url(addr).ok_or_else(|| {
                    ConfigError::new(
                        FIELD,
                        format!(
                            "{:?} is not a sentinel address; use host:port (e.g. \"10.0.0.1:26379\") or redis://host:port",
                            redact_url(addr)
                        ),
                    )
                })?;
                let own = redis::IntoConnectionInfo::into_connection_info(url.as_str())
                    .is_ok_and(|i| i.redis_settings().password().is_some());
                let credentials = if own {
                    None
                } else {
                    self.sentinel_credentials.as_ref()
                };
                let info = self.connection_info_as(FIELD, &url, credentials)?;
                self.client(info, FIELD)
            })
            .collect::<Result<Vec<_>, _>>()?;
        // The primary is reached as the Sentinels are (TLS or not), at an address they name.
        let scheme = if sentinels[0].starts_with("rediss://") {
            "rediss"
        } else {
            "redis"
        };
        let node = self.connection_info(FIELD, &format!("{scheme}://127.0.0.1:6379"))?;
        let node = self.client(node, FIELD)?.get_connection_info().clone();
        Ok(SentinelTarget {
            sentinels: clients,
            master: master.to_owned(),
            node,
            response_timeout: self.timeout,
        })
    }
}

/// A Sentinel's URL: `addr` itself when it is a Redis URL, `redis://addr` when it is
/// `host:port`; `None` for anything else.
fn sentinel_url(addr: &str) -> Option<String> {
    if addr.contains("://") {
        return Some(addr.to_owned());
    }
    let (host, port) = addr.rsplit_once(':')?;
    port.parse::<u16>().ok()?;
    let plain = !host.is_empty() && !host.contains(['/', '@', '?', '#']);
    plain.then(|| format!("redis://{addr}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The Sentinels and the primary they name, as `sentinel_target` builds them.
    fn sentinel_target_of(backend: &RedisBackend) -> SentinelTarget {
        let TargetSpec::Sentinel(sentinels, master) = &backend.target else {
            panic!("a sentinel backend");
        };
        backend.sentinel_target(sentinels, master).unwrap()
    }

    #[test]
    fn sentinels_get_their_own_credentials_and_the_primary_the_nodes() {
        use redis::ConnectionAddr;
        let backend = RedisBackend::sentinel(
            [
                "10.0.0.1:26379",
                "redis://u:url-pw@10.0.0.2:26380",
                "[::1]:26381",
            ],
            "mymaster",
        )
        .credentials("node", "node-pw")
        .sentinel_credentials("sentinel", "sentinel-pw");
        let target = sentinel_target_of(&backend);
        assert_eq!(target.master, "mymaster");
        let settings = |i: usize| {
            let info = target.sentinels[i].get_connection_info();
            let s = info.redis_settings();
            (
                info.addr().clone(),
                s.username().map(str::to_owned),
                s.password().map(str::to_owned),
            )
        };
        assert_eq!(
            settings(0),
            (
                ConnectionAddr::Tcp("10.0.0.1".into(), 26379),
                Some("sentinel".into()),
                Some("sentinel-pw".into())
            )
        );
        assert_eq!(
            settings(1),
            (
                ConnectionAddr::Tcp("10.0.0.2".into(), 26380),
                Some("u".into()),
                Some("url-pw".into())
            ),
            "credentials in a sentinel's URL take precedence"
        );
        assert_eq!(settings(2).0, ConnectionAddr::Tcp("::1".into(), 26381));
        let node = target.node.redis_settings();
        assert_eq!(
            (node.username(), node.password()),
            (Some("node"), Some("node-pw"))
        );
        assert!(matches!(target.node.addr(), ConnectionAddr::Tcp(..)));
        let debug = format!("{target:?} {backend:?}");
        assert!(!debug.contains("-pw"), "{debug}");
    }

    #[cfg(feature = "redis-tls")]
    #[test]
    fn tls_sentinels_mean_a_tls_primary() {
        let target = sentinel_target_of(&RedisBackend::sentinel(["rediss://10.0.0.1:26379"], "m"));
        assert!(matches!(
            target.node.addr(),
            redis::ConnectionAddr::TcpTls { .. }
        ));
    }
}
