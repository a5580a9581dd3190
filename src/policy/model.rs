//! The policy document as serde reads it: plain values, validated by `compile`.
//!
//! Text fields (quotas, algorithms, failure policies) stay text here so that a bad value is
//! reported by `compile` with its limit and field, not as a type error.

use std::collections::BTreeMap;

use serde::Deserialize;

/// One `[[limit]]` table.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct LimitDoc {
    pub(crate) name: String,
    #[serde(default)]
    pub(crate) quota: Option<String>,
    #[serde(default)]
    pub(crate) algorithm: Option<String>,
    #[serde(default)]
    pub(crate) key: Option<KeyDoc>,
    #[serde(default)]
    pub(crate) routes: Vec<String>,
    #[serde(default)]
    pub(crate) cost: Option<u64>,
    #[serde(default)]
    pub(crate) costs: BTreeMap<String, u64>,
    #[serde(default)]
    pub(crate) mode: Option<String>,
    #[serde(default)]
    pub(crate) shadow_headers: Option<bool>,
    #[serde(default)]
    pub(crate) on_store_error: Option<String>,
    #[serde(default)]
    pub(crate) on_missing_key: Option<StatusOrWord>,
    #[serde(default)]
    pub(crate) charge: Option<ChargeDoc>,
    #[serde(default)]
    pub(crate) plans: BTreeMap<String, PlanDoc>,
    #[serde(default)]
    pub(crate) default_plan: Option<String>,
    #[serde(default)]
    pub(crate) assign: BTreeMap<String, String>,
    #[serde(default)]
    pub(crate) plan_header: Option<String>,
    #[serde(default)]
    pub(crate) plan_extension: Option<bool>,
    #[serde(default)]
    pub(crate) on_unknown_plan: Option<StatusOrWord>,
}

/// `key = "peer_ip"`, or a table naming one extractor with its settings.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub(crate) enum KeyDoc {
    Name(String),
    Table(KeyTable),
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct KeyTable {
    #[serde(default)]
    pub(crate) header: Option<String>,
    #[serde(default)]
    pub(crate) peer_ip: Option<PeerIpDoc>,
    #[serde(default)]
    pub(crate) client_ip: Option<ClientIpDoc>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct PeerIpDoc {
    #[serde(default)]
    pub(crate) ipv6_prefix: Option<u8>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ClientIpDoc {
    #[serde(default)]
    pub(crate) trusted_proxies: Vec<String>,
    #[serde(default)]
    pub(crate) headers: Vec<String>,
    #[serde(default)]
    pub(crate) ipv6_prefix: Option<u8>,
}

/// `free = "5/min"`, or `free = { quota = "5/min", link = "https://..." }`.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub(crate) enum PlanDoc {
    Quota(String),
    Table(PlanTable),
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct PlanTable {
    pub(crate) quota: String,
    #[serde(default)]
    pub(crate) link: Option<String>,
}

impl PlanDoc {
    pub(crate) fn quota(&self) -> &str {
        match self {
            PlanDoc::Quota(q) => q,
            PlanDoc::Table(t) => &t.quota,
        }
    }

    pub(crate) fn link(&self) -> Option<&str> {
        match self {
            PlanDoc::Quota(_) => None,
            PlanDoc::Table(t) => t.link.as_deref(),
        }
    }
}

/// `401`, or a word (`"skip"`, `"reject"`, `"default"`).
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub(crate) enum StatusOrWord {
    Status(u64),
    Word(String),
}

/// `charge = { only_status = [401] }` or `charge = { refund_status = ["5xx"] }`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ChargeDoc {
    #[serde(default)]
    pub(crate) only_status: Option<Vec<StatusOrWord>>,
    #[serde(default)]
    pub(crate) refund_status: Option<Vec<StatusOrWord>>,
}
