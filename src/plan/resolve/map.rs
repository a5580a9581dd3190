//! [`PlanMap`]: a fixed assignment of keys (API keys) to plans.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use crate::decision::Name;
use crate::key::{Key, KeyValue};
use crate::plan::{PlanResolver, Resolution};
use crate::request::RequestView;

/// Resolves the plan from the limit's key through a fixed map: `free-key-1` → `free`.
///
/// The map is matched against the key's value (an API key read by
/// [`HeaderKey`](crate::key::HeaderKey), a user id, an address), ignoring any route scope. A key
/// that is not in the map is [`Resolution::Unknown`], so the limit's `on_unknown_plan` decides
/// (its own quota, or a refusal such as `401`). Policies build one from their `assign` table; for
/// assignments that live in a database use [`CachedLookup`](super::CachedLookup).
///
/// ```
/// use std::net::IpAddr;
/// use tollgate::key::Key;
/// use tollgate::plan::{PlanMap, PlanResolver, Resolution};
/// use tollgate::RequestView;
///
/// let office: IpAddr = "192.0.2.10".parse().unwrap();
/// let plans = PlanMap::new()
///     .assign("free-key-1", "free")
///     .assign("pro-key-1", "pro")
///     .assign_key(Key::ip(office), "internal");
/// assert_eq!(plans.len(), 3);
///
/// let req = http::Request::get("/").body(()).unwrap();
/// let plan = |key: Key<'_>| match plans.resolve(&RequestView::new(&req), &key) {
///     Resolution::Plan(name) => name.as_str().to_owned(),
///     _ => "unknown".to_owned(),
/// };
/// assert_eq!(plan(Key::bytes(&b"pro-key-1"[..])), "pro");
/// assert_eq!(plan(Key::ip(office)), "internal");
/// assert_eq!(plan(Key::string("guess")), "unknown");
/// ```
#[derive(Clone, Default)]
pub struct PlanMap {
    plans: Arc<HashMap<KeyValue<'static>, Name, foldhash::fast::RandomState>>,
}

impl PlanMap {
    /// An empty map: every key is unknown.
    pub fn new() -> Self {
        Self::default()
    }

    /// Assigns the key whose value is `key` (bytes: an API key, a principal's name) to `plan`.
    /// A later assignment of the same key replaces an earlier one.
    #[must_use]
    pub fn assign(self, key: impl AsRef<[u8]>, plan: impl AsRef<str>) -> Self {
        self.assign_key(Key::bytes(key.as_ref().to_vec()), plan)
    }

    /// Assigns `key` (any kind: an address, a number) to `plan`; its route scope is ignored. A
    /// plan name longer than [`Name::MAX_LEN`] bytes names no plan: the key resolves to
    /// it, and the layer treats it as unknown.
    #[must_use]
    pub fn assign_key(mut self, key: Key<'_>, plan: impl AsRef<str>) -> Self {
        Arc::make_mut(&mut self.plans).insert(owned_value(key.value()), Name::new(plan));
        self
    }

    /// The number of keys assigned.
    pub fn len(&self) -> usize {
        self.plans.len()
    }

    /// Whether no key is assigned.
    pub fn is_empty(&self) -> bool {
        self.plans.is_empty()
    }

    /// The plan assigned to `key`, if any.
    pub fn get(&self, key: &Key<'_>) -> Option<Name> {
        // `KeyValue` is covariant: the map's 'static keys compare with the request's.
        let plans: &HashMap<KeyValue<'_>, Name, _> = &self.plans;
        plans.get(key.value()).copied()
    }
}

/// `value`, owning its bytes.
pub(super) fn owned_value(value: &KeyValue<'_>) -> KeyValue<'static> {
    match value {
        KeyValue::Global => KeyValue::Global,
        KeyValue::Ip(ip) => KeyValue::Ip(*ip),
        KeyValue::Int(n) => KeyValue::Int(*n),
        KeyValue::Bytes(b) => KeyValue::Bytes(b.clone().into_owned().into()),
    }
}

impl PlanResolver for PlanMap {
    #[inline]
    fn resolve(&self, _req: &RequestView<'_>, key: &Key<'_>) -> Resolution {
        match self.get(key) {
            Some(plan) => Resolution::Plan(plan),
            None => Resolution::Unknown,
        }
    }
}

impl fmt::Debug for PlanMap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Keys are credentials: never print them.
        f.debug_struct("PlanMap")
            .field("keys", &self.plans.len())
            .finish()
    }
}
