//! [`ConcurrencyLimitLayer`] and its builder.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use http::{Response, StatusCode};
use tower_layer::Layer;

use super::service::ConcurrencyLimit;
use super::table::MemorySlots;
use crate::decision::Name;
use crate::error::ConfigError;
use crate::key::MissingKey;
use crate::key::{GlobalKey, KeyExtractor};
use crate::request::RequestView;
use crate::response::{grpc_trailers_only, GrpcCode, ProblemDetails, RejectionBody};

/// The default bound on keys with a request in flight or waiting.
pub const DEFAULT_MAX_KEYS: usize = 100_000;

/// The longest accepted queue `max_wait`: a request waits for a slot at most this long.
const MAX_QUEUE_WAIT: Duration = Duration::from_secs(3600);

/// Where the slots live.
#[derive(Debug)]
pub(crate) enum Slots {
    Memory(Arc<MemorySlots>),
    #[cfg(feature = "redis")]
    Redis(Arc<super::redis::RedisTable>),
}

/// Waiting for a slot instead of being refused.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Queue {
    pub(crate) max_wait: Duration,
    pub(crate) per_key: usize,
}

/// What the service shares: the configuration and the slot table.
pub(crate) struct Shared {
    pub(crate) name: Name,
    pub(crate) max_in_flight: u32,
    pub(crate) key: Box<dyn KeyExtractor>,
    pub(crate) on_missing_key: MissingKey,
    pub(crate) queue: Option<Queue>,
    pub(crate) slots: Slots,
    pub(crate) fail_open: bool,
}

/// Why a request gets no slot.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Refusal {
    /// Every slot is taken (and the queue, if any, is full).
    Full { in_flight: u32 },
    /// The request waited `max_wait` in the queue.
    Waited { waited: Duration },
    /// The table holds its maximum number of keys.
    TooManyKeys,
    /// The slot store failed (Redis unreachable) and the layer fails closed.
    Unavailable,
    /// The request has no key; `fix` is the extractor's reason when the server is misconfigured.
    MissingKey {
        status: StatusCode,
        fix: Option<&'static str>,
    },
}

impl Shared {
    /// The response refusing a request for `why`: RFC 9457 problem+json, or a gRPC
    /// trailers-only response to a gRPC call.
    pub(crate) fn refuse(&self, req: &RequestView<'_>, why: Refusal) -> Response<RejectionBody> {
        let name = self.name.as_str();
        let max = self.max_in_flight;
        let (status, ty, title, detail) = match why {
            Refusal::Full { .. } => (
                StatusCode::TOO_MANY_REQUESTS,
                "urn:tollgate:problem:concurrency-limited",
                "Too Many Requests",
                format!("Concurrency limit \"{name}\" ({max} in flight per key) is reached; retry when a request finishes."),
            ),
            Refusal::Waited { waited } => (
                StatusCode::TOO_MANY_REQUESTS,
                "urn:tollgate:problem:concurrency-limited",
                "Too Many Requests",
                format!("Concurrency limit \"{name}\" ({max} in flight per key) stayed reached for {} ms; retry when a request finishes.", waited.as_millis()),
            ),
            Refusal::TooManyKeys => (
                StatusCode::SERVICE_UNAVAILABLE,
                "urn:tollgate:problem:concurrency-table-full",
                "Service Unavailable",
                format!("Concurrency limit \"{name}\" tracks as many keys as it may; retry shortly."),
            ),
            Refusal::Unavailable => (
                StatusCode::SERVICE_UNAVAILABLE,
                "urn:tollgate:problem:limiter-unavailable",
                "Service Unavailable",
                format!("Concurrency limit \"{name}\" cannot reach its slot store; retry shortly."),
            ),
            Refusal::MissingKey { status, fix } => (
                status,
                "urn:tollgate:problem:missing-key",
                "Concurrency Limit Key Unavailable",
                match fix {
                    Some(fix) => format!("Concurrency limit \"{name}\" cannot identify the client because the server is misconfigured: {fix}."),
                    None => format!("Concurrency limit \"{name}\" found no key in the request."),
                },
            ),
        };
        if req.is_grpc() {
            return grpc_trailers_only(GrpcCode::from_http(status), &detail);
        }
        let mut problem = ProblemDetails::new(status, ty, title)
            .detail(&detail)
            .member_str("policy", name);
        if matches!(why, Refusal::Full { .. } | Refusal::Waited { .. }) {
            problem = problem.member_u64("limit", u64::from(max));
        }
        if let Refusal::Full { in_flight } = why {
            problem = problem.member_u64("in_flight", u64::from(in_flight));
        }
        problem.into_response()
    }
}

/// Caps the requests in flight per key; see the [module docs](super).
///
/// Built with [`ConcurrencyLimitLayer::builder`]; cheap to clone (the slot table is shared by
/// every clone and every service it makes).
#[derive(Clone)]
pub struct ConcurrencyLimitLayer {
    shared: Arc<Shared>,
}

impl fmt::Debug for ConcurrencyLimitLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConcurrencyLimitLayer")
            .field("name", &self.shared.name)
            .field("max_in_flight", &self.shared.max_in_flight)
            .field("queue", &self.shared.queue)
            .finish_non_exhaustive()
    }
}

impl ConcurrencyLimitLayer {
    /// A builder for a limit of `max_in_flight` requests in flight per key (one global key
    /// unless [`key`](ConcurrencyLimitLayerBuilder::key) says otherwise).
    pub fn builder(max_in_flight: u32) -> ConcurrencyLimitLayerBuilder {
        ConcurrencyLimitLayerBuilder {
            name: Name::new("concurrency"),
            max_in_flight,
            key: Box::new(GlobalKey),
            on_missing_key: MissingKey::default(),
            queue: None,
            max_keys: DEFAULT_MAX_KEYS,
            #[cfg(feature = "redis")]
            redis: None,
            fail_open: false,
        }
    }

    /// Requests in flight for `key` in this layer's in-memory table (0 for Redis slots).
    pub fn in_flight(&self, key: &crate::key::Key<'_>) -> u32 {
        match &self.shared.slots {
            Slots::Memory(t) => t.in_flight(key),
            #[cfg(feature = "redis")]
            Slots::Redis(_) => 0,
        }
    }
}

impl<S> Layer<S> for ConcurrencyLimitLayer {
    type Service = ConcurrencyLimit<S>;

    fn layer(&self, inner: S) -> Self::Service {
        ConcurrencyLimit::from_shared(inner, Arc::clone(&self.shared))
    }
}

/// Configures a [`ConcurrencyLimitLayer`]; see the [module docs](super).
#[must_use]
pub struct ConcurrencyLimitLayerBuilder {
    name: Name,
    max_in_flight: u32,
    key: Box<dyn KeyExtractor>,
    on_missing_key: MissingKey,
    queue: Option<Queue>,
    max_keys: usize,
    #[cfg(feature = "redis")]
    redis: Option<super::RedisSlots>,
    fail_open: bool,
}

impl fmt::Debug for ConcurrencyLimitLayerBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConcurrencyLimitLayerBuilder")
            .field("name", &self.name)
            .field("max_in_flight", &self.max_in_flight)
            .field("queue", &self.queue)
            .field("max_keys", &self.max_keys)
            .finish_non_exhaustive()
    }
}

impl ConcurrencyLimitLayerBuilder {
    /// The limit's name, reported in rejection bodies (default `"concurrency"`); at most
    /// [`Name::MAX_LEN`] (47) bytes, or [`build`](Self::build) refuses it.
    pub fn name(mut self, name: impl AsRef<str>) -> Self {
        self.name = Name::new(name);
        self
    }

    /// What requests are counted per: any [`KeyExtractor`] ([`PeerIp`](crate::key::PeerIp),
    /// a header, a principal, a closure). Default: one [`GlobalKey`] for all.
    pub fn key(mut self, key: impl KeyExtractor) -> Self {
        self.key = Box::new(key);
        self
    }

    /// What to do with a request the key extractor finds no key in (default: refuse, as
    /// [`MissingKey::Reject`] says).
    pub fn on_missing_key(mut self, policy: MissingKey) -> Self {
        self.on_missing_key = policy;
        self
    }

    /// Queues a request that finds every slot of its key taken, instead of refusing it: it
    /// waits, first come first served per key, for a slot to be given back, up to `max_wait`,
    /// with at most `max_queued` requests waiting per key; beyond either it is refused. A
    /// waiting request costs one timer and one channel, and dropping it leaves the queue.
    /// In-memory slots only.
    ///
    /// `max_wait` must be above zero and at most 1 hour, `max_queued` at least 1; otherwise
    /// [`build`](Self::build) returns a [`ConfigError`] for the field `queue.max_wait` or
    /// `queue.max_queued`.
    pub fn queue(mut self, max_wait: Duration, max_queued: usize) -> Self {
        self.queue = Some(Queue {
            max_wait,
            per_key: max_queued,
        });
        self
    }

    /// The most keys the in-memory table tracks at once (default [`DEFAULT_MAX_KEYS`]); a
    /// key is tracked only while it has a request in flight or waiting. A request for a new
    /// key beyond the bound is refused with `503`.
    pub fn max_keys(mut self, max_keys: usize) -> Self {
        self.max_keys = max_keys;
        self
    }

    /// Keeps the slots in Redis, shared by every instance, as leases that expire (see
    /// [`RedisSlots`](super::RedisSlots)).
    #[cfg(feature = "redis")]
    pub fn redis(mut self, slots: super::RedisSlots) -> Self {
        self.redis = Some(slots);
        self
    }

    /// Lets requests through when the slot store cannot answer (Redis unreachable), instead of
    /// refusing them with `503` (the default).
    pub fn fail_open(mut self, fail_open: bool) -> Self {
        self.fail_open = fail_open;
        self
    }

    /// Builds the layer, or says what is misconfigured.
    pub fn build(self) -> Result<ConcurrencyLimitLayer, ConfigError> {
        crate::decision::refuse_over_long("name", "concurrency limit name", self.name)?;
        if self.max_in_flight == 0 {
            return Err(ConfigError::new(
                "max_in_flight",
                "a concurrency limit of 0 refuses every request; use at least 1",
            ));
        }
        if self.max_keys == 0 {
            return Err(ConfigError::new(
                "max_keys",
                "a concurrency table of 0 keys refuses every request; use at least 1 (the default is 100000)",
            ));
        }
        if let Some(q) = self.queue {
            if q.max_wait.is_zero() || q.max_wait > MAX_QUEUE_WAIT {
                return Err(ConfigError::new(
                    "queue.max_wait",
                    format!(
                        "a queue's max_wait of {:?} is out of range: use more than zero and at most 1 hour (3600 s); drop .queue(..) to refuse at once",
                        q.max_wait
                    ),
                ));
            }
            if q.per_key == 0 {
                return Err(ConfigError::new(
                    "queue.max_queued",
                    "a queue needs room for at least one request; drop .queue(..) to refuse at once",
                ));
            }
        }
        #[cfg(feature = "redis")]
        let slots = match self.redis {
            Some(_) if self.queue.is_some() => {
                return Err(ConcurrencyLimitLayerBuilder::redis_queue_error());
            }
            Some(redis) => Slots::Redis(redis.build(self.name.as_str(), self.max_in_flight)?),
            None => Slots::Memory(MemorySlots::new(self.max_in_flight, self.max_keys)),
        };
        #[cfg(not(feature = "redis"))]
        let slots = Slots::Memory(MemorySlots::new(self.max_in_flight, self.max_keys));
        Ok(ConcurrencyLimitLayer {
            shared: Arc::new(Shared {
                name: self.name,
                max_in_flight: self.max_in_flight,
                key: self.key,
                on_missing_key: self.on_missing_key,
                queue: self.queue,
                slots,
                fail_open: self.fail_open,
            }),
        })
    }

    #[cfg(feature = "redis")]
    fn redis_queue_error() -> ConfigError {
        ConfigError::new(
            "queue",
            "Redis concurrency slots cannot queue (a wait across instances has no first-come order to keep); drop .queue(..) to refuse at once, or use in-memory slots",
        )
    }
}
