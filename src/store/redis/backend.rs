//! [`RedisBackend`]: where the store connects (a node or a Cluster), its settings, and the
//! checks every setting and limit passes before a [`RedisStore`] is built from them.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use super::conn::Target;
use super::fallback::{local_share, LocalStore};
use super::keys::{encode_name, KeyEncoder};
use super::script::{limit_info, LimitInfo, LuaScript};
use super::slots::SlotCache;
use super::stats::RedisStats;
use super::store::{Inner, RedisStore};
use super::{
    DEFAULT_BREAKER_THRESHOLD, DEFAULT_CONNECT_TIMEOUT, DEFAULT_MAX_BATCH, DEFAULT_MAX_IN_FLIGHT,
    DEFAULT_PROBE_INTERVAL, DEFAULT_TIMEOUT, MAX_BATCH, MAX_BREAKER_THRESHOLD, MAX_IN_FLIGHT,
    MAX_SLIDING_LOG, MAX_TIMEOUT,
};
use crate::algorithm::AlgorithmKind;
use crate::clock::Clock;
use crate::error::ConfigError;
use crate::quota::Quota;
use crate::store::memory::MemoryBackend;
use crate::store::{Backend, FailurePolicy, LimitSpec, MAX_LIMITS};

/// Configuration of a Redis (or Redis Cluster) store; see the [module docs](super).
///
/// ```
/// use std::time::Duration;
/// use tollgate::store::redis::RedisBackend;
///
/// let backend = RedisBackend::new("redis://127.0.0.1:6379")
///     .prefix("api-rl")
///     .timeout(Duration::from_millis(3))
///     .breaker_threshold(3)
///     .probe_interval(Duration::from_millis(500));
/// # let _ = backend;
/// ```
#[must_use]
pub struct RedisBackend {
    pub(super) target: TargetSpec,
    prefix: String,
    hash_secret: Vec<u8>,
    readable_keys: bool,
    pub(super) timeout: Duration,
    connect_timeout: Duration,
    breaker_threshold: u32,
    probe_interval: Duration,
    clock: Option<Arc<dyn Clock>>,
    batching: bool,
    max_batch: usize,
    max_in_flight: usize,
    local: Option<LocalBuilder>,
    stats: RedisStats,
    credentials: Option<Credentials>,
    pub(super) sentinel_credentials: Option<Credentials>,
    #[cfg(feature = "redis-tls")]
    tls: TlsFiles,
}

/// A username and password for Redis `AUTH`; never printed.
#[derive(Clone)]
pub(super) struct Credentials {
    pub(super) username: String,
    pub(super) password: String,
}

/// PEM certificates for `rediss://` connections; printed only as whether each is set.
#[cfg(feature = "redis-tls")]
#[derive(Clone, Default)]
struct TlsFiles {
    root: Option<Vec<u8>>,
    client: Option<(Vec<u8>, Vec<u8>)>,
}

pub(super) type LocalBuilder =
    Box<dyn FnOnce(&[LimitSpec]) -> Result<Box<dyn LocalStore>, ConfigError> + Send>;

#[derive(Clone)]
pub(super) enum TargetSpec {
    Node(String),
    Cluster(Vec<String>),
    /// Sentinels (`host:port` or URLs) and the master name they monitor the primary as.
    Sentinel(Vec<String>, String),
}

/// URLs with their credentials replaced by `***`.
impl fmt::Debug for TargetSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TargetSpec::Node(url) => f.debug_tuple("Node").field(&redact_url(url)).finish(),
            TargetSpec::Cluster(nodes) => f
                .debug_tuple("Cluster")
                .field(&nodes.iter().map(|n| redact_url(n)).collect::<Vec<_>>())
                .finish(),
            TargetSpec::Sentinel(sentinels, master) => f
                .debug_tuple("Sentinel")
                .field(&sentinels.iter().map(|n| redact_url(n)).collect::<Vec<_>>())
                .field(master)
                .finish(),
        }
    }
}

/// `url` with the user information (`user:password@`) replaced by `***@`, for errors and
/// `Debug` output.
pub(crate) fn redact_url(url: &str) -> String {
    let start = url.find("://").map_or(0, |i| i + 3);
    let rest = &url[start..];
    // The user information ends at the first `@` whose host part (up to `/`, `?`, `#` or the
    // end) holds no other `@`: a password may hold an unencoded `@`, `/`, `?` or `#` (such a
    // URL does not parse, and its error shows it). In doubt, more is hidden, never less.
    let at = rest.match_indices('@').map(|(i, _)| i).find(|&i| {
        let after = &rest[i + 1..];
        let host_end = after.find(['/', '?', '#']).unwrap_or(after.len());
        !after[..host_end].contains('@')
    });
    match at {
        Some(at) => format!("{}***{}", &url[..start], &rest[at..]),
        None => url.to_owned(),
    }
}

impl fmt::Debug for RedisBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("RedisBackend");
        d.field("target", &self.target).field(
            "credentials",
            &self.credentials.as_ref().map(|_| "<redacted>"),
        );
        if self.sentinel_credentials.is_some() {
            d.field("sentinel_credentials", &"<redacted>");
        }
        #[cfg(feature = "redis-tls")]
        d.field("tls_root_certificate", &self.tls.root.is_some())
            .field("tls_client_certificate", &self.tls.client.is_some());
        d.field("prefix", &self.prefix)
            .field("timeout", &self.timeout)
            .field("breaker_threshold", &self.breaker_threshold)
            .field("probe_interval", &self.probe_interval)
            .field("clock", &self.clock)
            .field("batching", &self.batching)
            .finish_non_exhaustive()
    }
}

impl RedisBackend {
    /// A single Redis node at `url` (`redis://[user:password@]host:port[/db]`, or `rediss://`
    /// for TLS with the `redis-tls` feature). The URL is
    /// checked when the layer is built. Building inside a tokio runtime starts connecting and
    /// loads the script in the background; otherwise the first request connects.
    pub fn new(url: impl Into<String>) -> Self {
        Self::with_target(TargetSpec::Node(url.into()))
    }

    /// A Redis Cluster reached through `nodes` (any subset of its nodes; the rest are discovered).
    pub fn cluster<I, S>(nodes: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Self::with_target(TargetSpec::Cluster(
            nodes.into_iter().map(Into::into).collect(),
        ))
    }

    pub(super) fn with_target(target: TargetSpec) -> Self {
        Self {
            target,
            prefix: "tollgate".to_owned(),
            hash_secret: Vec::new(),
            readable_keys: false,
            timeout: DEFAULT_TIMEOUT,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            breaker_threshold: DEFAULT_BREAKER_THRESHOLD,
            probe_interval: DEFAULT_PROBE_INTERVAL,
            clock: None,
            batching: true,
            max_batch: DEFAULT_MAX_BATCH,
            max_in_flight: DEFAULT_MAX_IN_FLIGHT,
            local: None,
            stats: RedisStats::default(),
            credentials: None,
            sentinel_credentials: None,
            #[cfg(feature = "redis-tls")]
            tls: TlsFiles::default(),
        }
    }

    /// Authenticates as `username` with `password` (a Redis 6 ACL user; `"default"` for a server
    /// configured with only `requirepass`), instead of credentials in the URL. On a Cluster,
    /// every node is authenticated alike. Neither appears in `Debug` output, errors or logs.
    /// The commands and keys the user needs: [ACLs](crate::guide::redis#acls).
    ///
    /// ```
    /// use tollgate::store::redis::RedisBackend;
    ///
    /// let password = std::env::var("REDIS_PASSWORD").unwrap_or_else(|_| "s3cret".into());
    /// let backend = RedisBackend::new("redis://10.0.0.5:6379").credentials("tollgate", &password);
    /// assert!(!format!("{backend:?}").contains(&password));
    /// ```
    pub fn credentials(mut self, username: impl Into<String>, password: impl Into<String>) -> Self {
        self.credentials = Some(Credentials {
            username: username.into(),
            password: password.into(),
        });
        self
    }

    /// Trusts the certificate authority in `pem` (PEM, one or more certificates) for
    /// `rediss://` connections, instead of the system's roots: for servers with a private CA.
    ///
    /// ```no_run
    /// use tollgate::store::redis::RedisBackend;
    ///
    /// # fn demo() -> std::io::Result<()> {
    /// let backend = RedisBackend::new("rediss://redis.internal:6380")
    ///     .tls_root_certificate(std::fs::read("/etc/redis/ca.crt")?);
    /// # let _ = backend;
    /// # Ok(())
    /// # }
    /// ```
    #[cfg(feature = "redis-tls")]
    pub fn tls_root_certificate(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.tls.root = Some(pem.into());
        self
    }

    /// Presents the client certificate `cert_pem` with its private key `key_pem` (both PEM) on
    /// `rediss://` connections: for servers that authenticate clients by certificate (Redis's
    /// `tls-auth-clients yes`, its default).
    #[cfg(feature = "redis-tls")]
    pub fn tls_client_certificate(
        mut self,
        cert_pem: impl Into<Vec<u8>>,
        key_pem: impl Into<Vec<u8>>,
    ) -> Self {
        self.tls.client = Some((cert_pem.into(), key_pem.into()));
        self
    }

    /// The namespace every key starts with (default `tollgate`): 1 to 64 characters of letters,
    /// digits, `.`, `_`, `:` or `-`.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// A secret shared by every instance: the key of the HMAC that names each client's Redis
    /// keys and picks its hash slot (see [Keys](super#keys)). Set it in production. Without one the
    /// HMAC is keyed with the empty string: client keys still never appear in clear, but anyone
    /// who can read Redis can hash guesses (which reverses IP addresses and small ids by brute
    /// force) and search offline for keys that land in a chosen slot. Every instance must use the
    /// same secret; changing it moves every client to fresh keys (a fresh budget, once).
    pub fn hash_secret(mut self, secret: impl AsRef<[u8]>) -> Self {
        self.hash_secret = secret.as_ref().to_vec();
        self
    }

    /// Whether IP-address keys are written readably in Redis key names (default `false`: every
    /// client key is an HMAC). An opt-in for operators who inspect Redis by IP and may store
    /// client addresses; other keys (API keys, tokens, user ids: [`Key::bytes`] and
    /// [`Key::int`]) are never readable, as nothing tells a secret from a name.
    ///
    /// [`Key::bytes`]: crate::key::Key::bytes
    /// [`Key::int`]: crate::key::Key::int
    pub fn readable_keys(mut self, readable: bool) -> Self {
        self.readable_keys = readable;
        self
    }

    /// How long one Redis call may take before the failure policy decides (default 5 ms).
    ///
    /// Until Redis has answered once (at start-up, while the connection and the script are set
    /// up), a call may take up to [`connect_timeout`](Self::connect_timeout) instead, so the
    /// first requests are not refused for the cost of connecting.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// How long establishing a connection may take (default 500 ms): it bounds the background
    /// reconnects, the calls made before Redis has answered for the first time, and, while a
    /// Cluster master's breaker is open, the probe's slot-map read and its check that the
    /// Cluster connection answers (see [When Redis cannot decide](super#when-redis-cannot-decide)).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// Consecutive failed calls that open the circuit breaker (default 5).
    pub fn breaker_threshold(mut self, failures: u32) -> Self {
        self.breaker_threshold = failures;
        self
    }

    /// How often Redis is probed while the circuit breaker is open (default 200 ms).
    pub fn probe_interval(mut self, interval: Duration) -> Self {
        self.probe_interval = interval;
        self
    }

    /// Decides at `clock`'s time instead of the Redis server's `TIME`. For tests and
    /// simulations: in production, application clocks that disagree would let instances mint
    /// tokens, which server time prevents. Like `TIME`, the time sent is Unix time:
    /// `clock.now_micros() + clock.unix_offset_micros()` (a [`ManualClock`](crate::clock::ManualClock)'s
    /// offset is 0 unless set), so calendar-aligned windows fall where the memory store puts them.
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = Some(Arc::new(clock));
        self
    }

    /// Whether concurrent checks are coalesced into one script call (default on): on a single
    /// node, into calls to it; on a Cluster, into calls to each master, whatever the hash slots
    /// of the keys it serves (see [the module docs](super)). Each request is still decided
    /// all-or-nothing, in arrival order, exactly as if sent alone; batching only saves round
    /// trips and per-call overhead. [`max_batch`](Self::max_batch) and
    /// [`max_in_flight`](Self::max_in_flight) apply to each batcher (each master's, on a
    /// Cluster).
    pub fn batching(mut self, enabled: bool) -> Self {
        self.batching = enabled;
        self
    }

    /// The most requests coalesced into one script call (default 64). A batch runs as one
    /// script, so this also bounds how long one call keeps Redis busy (about 4 µs per decision).
    pub fn max_batch(mut self, max: usize) -> Self {
        self.max_batch = max;
        self
    }

    /// How many batched script calls may be on the wire at once (default 4). Requests arriving
    /// while that many are in flight wait and form the next batch.
    pub fn max_in_flight(mut self, max: usize) -> Self {
        self.max_in_flight = max;
        self
    }

    /// The in-memory backend used for limits whose failure policy is
    /// [`FailurePolicy::Local`] (default: [`MemoryBackend::new`]): set its key bound, or a clock
    /// for tests.
    pub fn local_fallback<C: Clock>(mut self, backend: MemoryBackend<C>) -> Self {
        self.local = Some(Box::new(move |specs| {
            Ok(Box::new(backend.build(specs)?) as Box<dyn LocalStore>)
        }));
        self
    }

    /// A handle to the counters of the store this backend will build.
    pub fn stats(&self) -> RedisStats {
        self.stats.clone()
    }
}

impl Backend for RedisBackend {
    type Store = RedisStore;

    fn build(self, limits: &[LimitSpec]) -> Result<RedisStore, ConfigError> {
        let (target, cluster) = self.connect_target()?;
        let keys = KeyEncoder::new(&self.prefix, &self.hash_secret, self.readable_keys)?;
        self.validate()?;
        let compiled = compile_limits(limits)?;
        let (local, local_builder) = if compiled.any_local {
            (Some(build_local(self.local, &compiled.local_specs)?), None)
        } else {
            (None, self.local)
        };
        let script = Arc::new(LuaScript::for_limits(&compiled.infos));
        Ok(RedisStore::from_inner(Inner {
            limits: compiled.infos,
            policies: compiled.policies,
            keys,
            script,
            target,
            cluster,
            connect_timeout: self.connect_timeout,
            timeout: self.timeout,
            breaker_threshold: self.breaker_threshold,
            probe_interval: self.probe_interval,
            clock: self.clock,
            batching: self
                .batching
                .then_some((self.max_batch, self.max_in_flight)),
            local,
            local_builder: Arc::new(std::sync::Mutex::new(local_builder)),
            stats: self.stats,
            links: Default::default(),
            breakers: Default::default(),
            slots: Arc::new(SlotCache::new(self.probe_interval, self.connect_timeout)),
            connected: Default::default(),
        }))
    }
}

/// A store's limits, checked and compiled for the script.
pub(crate) struct CompiledLimits {
    pub(crate) infos: Vec<LimitInfo>,
    pub(crate) policies: Vec<FailurePolicy>,
    /// The local fallback's limits (each limit's share of its quota, when `Local`).
    pub(crate) local_specs: Vec<LimitSpec>,
    pub(crate) any_local: bool,
}

/// Checks `limits` (count, unique names, failure policies, Redis bounds) and compiles them.
pub(crate) fn compile_limits(limits: &[LimitSpec]) -> Result<CompiledLimits, ConfigError> {
    if limits.is_empty() || limits.len() > MAX_LIMITS {
        return Err(ConfigError::new(
            "limits",
            format!("configure 1 to {MAX_LIMITS} limits per layer; stack layers for more"),
        ));
    }
    let mut infos = Vec::with_capacity(limits.len());
    let mut policies = Vec::with_capacity(limits.len());
    let mut local_specs = Vec::with_capacity(limits.len());
    let mut any_local = false;
    for (i, spec) in limits.iter().enumerate() {
        spec.validate()?;
        let name = spec.name();
        if limits[..i].iter().any(|s| s.name() == name) {
            return Err(ConfigError::new(
                "limit.name",
                format!(
                    "two limits are named {:?}; names must be unique because they name the Redis keys",
                    name.as_str()
                ),
            ));
        }
        let policy = spec.failure_policy().ok_or_else(|| {
            ConfigError::new(
                "failure_policy",
                format!(
                    "limit {:?} has no failure policy; a Redis-backed limit must say what happens when Redis is unreachable: set FailurePolicy::Open, FailurePolicy::Closed {{ retry_after }} or FailurePolicy::Local {{ share }} with Limit::on_store_error",
                    name.as_str()
                ),
            )
        })?;
        let local_spec = match policy {
            FailurePolicy::Local { share } => {
                any_local = true;
                LimitSpec::new(name, local_quota(spec, share)?, spec.algorithm())
            }
            _ => LimitSpec::new(name, *spec.quota(), spec.algorithm()),
        };
        local_specs.push(local_spec);
        let info = limit_info(spec, encode_name(name.as_str())?)?;
        if spec.algorithm() == AlgorithmKind::SlidingLog && info.limit > MAX_SLIDING_LOG {
            return Err(ConfigError::new(
                "quota.count",
                format!(
                    "limit {:?}: a sliding log on Redis keeps one entry per admission, so its count must be at most {MAX_SLIDING_LOG} (got {}); use AlgorithmKind::SlidingWindow for larger limits",
                    name.as_str(),
                    info.limit
                ),
            ));
        }
        infos.push(info);
        policies.push(policy);
    }
    Ok(CompiledLimits {
        infos,
        policies,
        local_specs,
        any_local,
    })
}

/// The local fallback store for `specs`: `builder`'s ([`RedisBackend::local_fallback`]), or a
/// default [`MemoryBackend`]'s.
pub(crate) fn build_local(
    builder: Option<LocalBuilder>,
    specs: &[LimitSpec],
) -> Result<Box<dyn LocalStore>, ConfigError> {
    match builder {
        Some(build) => build(specs),
        None => Ok(Box::new(MemoryBackend::new().build(specs)?)),
    }
}

impl RedisBackend {
    /// The client for the configured node or Cluster, with credentials and TLS applied.
    fn connect_target(&self) -> Result<(Target, bool), ConfigError> {
        match &self.target {
            TargetSpec::Node(url) => {
                let info = self.connection_info("redis.url", url)?;
                Ok((
                    Target::Node(Box::new(self.client(info, "redis.url")?)),
                    false,
                ))
            }
            TargetSpec::Cluster(nodes) => {
                let Some(first) = nodes.first() else {
                    return Err(ConfigError::new(
                        "redis.cluster",
                        "no cluster nodes given; pass at least one redis://host:port",
                    ));
                };
                let infos = nodes
                    .iter()
                    .map(|n| self.connection_info("redis.cluster", n))
                    .collect::<Result<Vec<_>, _>>()?;
                #[allow(unused_mut)]
                let mut builder = redis::cluster::ClusterClient::builder(infos).retries(2);
                #[cfg(feature = "redis-tls")]
                if let Some(certs) = self.tls_certificates() {
                    builder = builder.certs(certs);
                }
                let client = builder.build().map_err(|e| {
                    ConfigError::new(
                        "redis.cluster",
                        format!(
                            "invalid cluster nodes {:?} ({e}); use redis://host:port",
                            nodes.iter().map(|n| redact_url(n)).collect::<Vec<_>>()
                        ),
                    )
                })?;
                // A probe connects to one node directly, with the first seed's settings
                // (credentials, TLS).
                let seed = self.connection_info("redis.cluster", first)?;
                let seed = self
                    .client(seed, "redis.cluster")?
                    .get_connection_info()
                    .clone();
                Ok((Target::Cluster(Box::new(client), Box::new(seed)), true))
            }
            TargetSpec::Sentinel(sentinels, master) => Ok((
                Target::Sentinel(Box::new(self.sentinel_target(sentinels, master)?)),
                false,
            )),
        }
    }

    /// `url` parsed, with the builder's credentials; errors name `field` and never print the
    /// URL's credentials.
    pub(super) fn connection_info(
        &self,
        field: &'static str,
        url: &str,
    ) -> Result<redis::ConnectionInfo, ConfigError> {
        self.connection_info_as(field, url, self.credentials.as_ref())
    }

    /// [`connection_info`](Self::connection_info) authenticated with `credentials`.
    pub(super) fn connection_info_as(
        &self,
        field: &'static str,
        url: &str,
        credentials: Option<&Credentials>,
    ) -> Result<redis::ConnectionInfo, ConfigError> {
        if !cfg!(feature = "redis-tls") && url.starts_with("rediss://") {
            return Err(ConfigError::new(
                field,
                format!(
                    "{:?} asks for TLS (rediss://), which needs tollgate's `redis-tls` feature",
                    redact_url(url)
                ),
            ));
        }
        let info = redis::IntoConnectionInfo::into_connection_info(url).map_err(|e| {
            ConfigError::new(
                field,
                format!(
                    "{:?} is not a Redis URL ({e}); use redis://host:port, or rediss://host:port for TLS",
                    redact_url(url)
                ),
            )
        })?;
        if self.has_tls_files() && !matches!(info.addr(), redis::ConnectionAddr::TcpTls { .. }) {
            return Err(ConfigError::new(
                field,
                format!(
                    "TLS certificates were given but {:?} is not a TLS URL; use rediss://host:port",
                    redact_url(url)
                ),
            ));
        }
        Ok(match credentials {
            Some(c) => {
                let settings = info
                    .redis_settings()
                    .clone()
                    .set_username(&c.username)
                    .set_password(&c.password);
                info.set_redis_settings(settings)
            }
            None => info,
        })
    }

    /// A client for one node.
    pub(super) fn client(
        &self,
        info: redis::ConnectionInfo,
        field: &'static str,
    ) -> Result<redis::Client, ConfigError> {
        #[cfg(feature = "redis-tls")]
        if matches!(info.addr(), redis::ConnectionAddr::TcpTls { .. }) {
            install_crypto_provider();
            if let Some(certs) = self.tls_certificates() {
                return redis::Client::build_with_tls(info, certs).map_err(|e| {
                    ConfigError::new(
                        "redis.tls",
                        format!("the TLS certificates could not be used ({e}); give PEM files"),
                    )
                });
            }
        }
        redis::Client::open(info).map_err(|e| {
            ConfigError::new(
                field,
                format!("not a usable Redis address ({e}); use redis://host:port"),
            )
        })
    }

    fn has_tls_files(&self) -> bool {
        #[cfg(feature = "redis-tls")]
        {
            self.tls.root.is_some() || self.tls.client.is_some()
        }
        #[cfg(not(feature = "redis-tls"))]
        {
            false
        }
    }

    #[cfg(feature = "redis-tls")]
    fn tls_certificates(&self) -> Option<redis::TlsCertificates> {
        if !self.has_tls_files() {
            return None;
        }
        Some(redis::TlsCertificates {
            client_tls: self
                .tls
                .client
                .as_ref()
                .map(|(cert, key)| redis::ClientTlsConfig {
                    client_cert: cert.clone(),
                    client_key: key.clone(),
                }),
            root_cert: self.tls.root.clone(),
        })
    }

    /// Checks every knob: a value that would switch limiting off, hang, or overflow is a
    /// [`ConfigError`] naming the field and what to use instead.
    fn validate(&self) -> Result<(), ConfigError> {
        let duration = |field: &'static str, d: Duration, example: &str| {
            if d.is_zero() || d > MAX_TIMEOUT {
                Err(ConfigError::new(
                    field,
                    format!(
                        "{d:?} is out of range: use a positive duration of at most {MAX_TIMEOUT:?}, e.g. {example}"
                    ),
                ))
            } else {
                Ok(())
            }
        };
        duration(
            "redis.timeout",
            self.timeout,
            "Duration::from_millis(5) (the default)",
        )?;
        duration(
            "redis.connect_timeout",
            self.connect_timeout,
            "Duration::from_millis(500) (the default)",
        )?;
        duration(
            "redis.probe_interval",
            self.probe_interval,
            "Duration::from_millis(200) (the default)",
        )?;
        if self.breaker_threshold == 0 || self.breaker_threshold > MAX_BREAKER_THRESHOLD {
            return Err(ConfigError::new(
                "redis.breaker_threshold",
                format!(
                    "{} is out of range: the breaker opens after 1 to {MAX_BREAKER_THRESHOLD} consecutive failures; the default is {DEFAULT_BREAKER_THRESHOLD}",
                    self.breaker_threshold
                ),
            ));
        }
        if self.max_batch == 0 || self.max_batch > MAX_BATCH {
            return Err(ConfigError::new(
                "redis.max_batch",
                format!(
                    "{} is out of range: a batch holds 1 to {MAX_BATCH} requests; the default is {DEFAULT_MAX_BATCH} (use .batching(false) to send each request alone)",
                    self.max_batch
                ),
            ));
        }
        if self.max_in_flight == 0 || self.max_in_flight > MAX_IN_FLIGHT {
            return Err(ConfigError::new(
                "redis.max_in_flight",
                format!(
                    "{} is out of range: 1 to {MAX_IN_FLIGHT} batches may be on the wire at once (0 would send nothing); the default is {DEFAULT_MAX_IN_FLIGHT}",
                    self.max_in_flight
                ),
            ));
        }
        Ok(())
    }
}

/// Makes rustls's `ring` provider the process default unless one is installed: rustls needs
/// one, and cannot choose by itself when another crate of the build enables a second provider.
/// rustls deprecates it for lacking post-quantum key exchange; an application that wants that
/// installs `aws-lc-rs`'s provider before building the store, and this leaves it in place.
#[cfg(feature = "redis-tls")]
#[allow(deprecated)]
fn install_crypto_provider() {
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
}

/// The quota a local fallback limiter holds: `share` of the count (and of an explicit burst),
/// rounded down, at least 1.
fn local_quota(spec: &LimitSpec, share: f64) -> Result<Quota, ConfigError> {
    if !(share > 0.0 && share <= 1.0) {
        return Err(ConfigError::new(
            "failure_policy.share",
            format!(
                "limit {:?}: the local share must be in (0, 1], e.g. 0.25 for one of four instances; got {share}",
                spec.name().as_str()
            ),
        ));
    }
    let local = local_share(spec.quota(), share);
    spec.algorithm().validate(&local)?;
    Ok(local)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithm::AlgorithmKind;
    use crate::Name;

    fn spec(name: &str) -> LimitSpec {
        LimitSpec::new(
            Name::new(name),
            Quota::per_second(10).burst(20),
            AlgorithmKind::TokenBucket,
        )
    }

    #[test]
    fn a_missing_failure_policy_is_a_config_error_that_says_how_to_fix_it() {
        let err = RedisBackend::new("redis://127.0.0.1:1")
            .build(&[spec("burst")])
            .unwrap_err();
        assert_eq!(err.field(), "failure_policy");
        assert!(err.message().contains("FailurePolicy::Closed"), "{err}");
        assert!(err.message().contains("\"burst\""), "{err}");
    }

    #[test]
    fn bad_settings_are_config_errors() {
        let ok = [spec("a").on_store_error(FailurePolicy::Open)];
        let cases = [
            (RedisBackend::new("http://nope"), "redis.url"),
            (RedisBackend::cluster(Vec::<String>::new()), "redis.cluster"),
            (
                RedisBackend::new("redis://h").prefix("a{b}"),
                "redis.prefix",
            ),
            (
                RedisBackend::new("redis://h").timeout(Duration::ZERO),
                "redis.timeout",
            ),
            (
                RedisBackend::new("redis://h").breaker_threshold(0),
                "redis.breaker_threshold",
            ),
            (
                RedisBackend::new("redis://h").max_batch(0),
                "redis.max_batch",
            ),
        ];
        for (backend, field) in cases {
            assert_eq!(backend.build(&ok).unwrap_err().field(), field);
        }
    }

    #[test]
    fn every_knob_that_could_switch_limiting_off_or_overflow_is_refused() {
        let ok = [spec("a").on_store_error(FailurePolicy::Open)];
        let node = || RedisBackend::new("redis://h");
        let cases = [
            (node().max_in_flight(0), "redis.max_in_flight"),
            (
                node().max_in_flight(MAX_IN_FLIGHT + 1),
                "redis.max_in_flight",
            ),
            (node().max_batch(MAX_BATCH + 1), "redis.max_batch"),
            (node().timeout(Duration::MAX), "redis.timeout"),
            (
                node().connect_timeout(Duration::MAX),
                "redis.connect_timeout",
            ),
            (
                node().connect_timeout(Duration::ZERO),
                "redis.connect_timeout",
            ),
            (node().probe_interval(Duration::MAX), "redis.probe_interval"),
            (
                node().probe_interval(Duration::ZERO),
                "redis.probe_interval",
            ),
            (
                node().breaker_threshold(u32::MAX),
                "redis.breaker_threshold",
            ),
        ];
        for (backend, field) in cases {
            let err = backend.build(&ok).unwrap_err();
            assert_eq!(err.field(), field, "{err}");
            assert!(
                err.message().contains("default"),
                "the message says what to use instead: {err}"
            );
        }
        // The bounds themselves are accepted.
        node()
            .max_in_flight(MAX_IN_FLIGHT)
            .max_batch(MAX_BATCH)
            .timeout(MAX_TIMEOUT)
            .connect_timeout(MAX_TIMEOUT)
            .probe_interval(MAX_TIMEOUT)
            .breaker_threshold(MAX_BREAKER_THRESHOLD)
            .build(&ok)
            .unwrap();
    }

    #[test]
    fn a_sliding_log_above_the_redis_bound_is_refused() {
        let log = |n: u64| {
            [LimitSpec::new(
                Name::new("log"),
                Quota::per_hour(n),
                AlgorithmKind::SlidingLog,
            )
            .on_store_error(FailurePolicy::Open)]
        };
        RedisBackend::new("redis://h")
            .build(&log(MAX_SLIDING_LOG))
            .unwrap();
        let err = RedisBackend::new("redis://h")
            .build(&log(MAX_SLIDING_LOG + 1))
            .unwrap_err();
        assert_eq!(err.field(), "quota.count");
        assert!(err.message().contains("SlidingWindow"), "{err}");
    }

    #[test]
    fn duplicate_names_and_bad_shares_are_config_errors() {
        let dup = [
            spec("a").on_store_error(FailurePolicy::Open),
            spec("a").on_store_error(FailurePolicy::Open),
        ];
        assert_eq!(
            RedisBackend::new("redis://h")
                .build(&dup)
                .unwrap_err()
                .field(),
            "limit.name"
        );
        let bad_share = [spec("a").on_store_error(FailurePolicy::Local { share: 1.5 })];
        assert_eq!(
            RedisBackend::new("redis://h")
                .build(&bad_share)
                .unwrap_err()
                .field(),
            "failure_policy.share"
        );
    }

    #[test]
    fn local_share_scales_count_and_burst() {
        let q = local_quota(&spec("a"), 0.25).unwrap();
        assert_eq!((q.count(), q.burst_size()), (2, 5));
        let q = local_quota(&spec("a"), 0.01).unwrap();
        assert_eq!((q.count(), q.burst_size()), (1, 1), "never below one");
        let window = LimitSpec::new(
            Name::new("w"),
            Quota::per_minute(100),
            AlgorithmKind::TokenBucket,
        );
        let q = local_quota(&window, 0.5).unwrap();
        assert!(!q.has_explicit_burst());
        assert_eq!(q.count(), 50);
    }

    #[test]
    fn urls_are_printed_without_their_credentials() {
        for (url, shown) in [
            ("redis://user:pw@h:6379/0", "redis://***@h:6379/0"),
            ("rediss://:pw@h:6380", "rediss://***@h:6380"),
            ("redis://u:p@ss@h:1?x=@", "redis://***@h:1?x=@"),
            ("redis://u:pa/ss@h:1", "redis://***@h:1"),
            ("redis://u:p?a#ss@h:1/0", "redis://***@h:1/0"),
            // An `@` after the host hides too much, never too little.
            ("redis://h:6379/0#a@b", "redis://***@b"),
            ("user:pw@h", "***@h"),
        ] {
            assert_eq!(redact_url(url), shown);
        }
        let backend = RedisBackend::cluster(["redis://u:secret@a:1", "redis://b:2"])
            .credentials("u", "other-secret");
        let debug = format!("{backend:?}");
        assert!(!debug.contains("secret"), "{debug}");
        assert!(
            debug.contains("***@a:1") && debug.contains("redis://b:2"),
            "{debug}"
        );
    }

    #[cfg(not(feature = "redis-tls"))]
    #[test]
    fn a_tls_url_without_the_feature_is_a_config_error() {
        let err = RedisBackend::new("rediss://u:secret@h:6380")
            .build(&[spec("a").on_store_error(FailurePolicy::Open)])
            .unwrap_err();
        assert_eq!(err.field(), "redis.url");
        assert!(err.message().contains("redis-tls"), "{err}");
        assert!(!err.message().contains("secret"), "{err}");
    }

    #[test]
    fn building_does_not_connect() {
        // Nothing listens on port 1; building still succeeds (connections are lazy).
        let store = RedisBackend::new("redis://127.0.0.1:1")
            .build(&[spec("a").on_store_error(FailurePolicy::Open)])
            .unwrap();
        assert!(store
            .redis_key(0, &crate::key::Key::string("k"))
            .unwrap()
            .starts_with("tollgate:{"));
        assert!(store.redis_key(1, &crate::key::Key::string("k")).is_none());
    }
}
