//! Compiling a [`Policy`](super::Policy) into [`Limit`]s, validating every field.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::algorithm::AlgorithmKind;
use crate::cost::CostTable;
use crate::key::MissingKey;
use crate::key::{
    ClientIp, ForwardedHeader, GlobalKey, HeaderKey, Key, KeyExtractor, PeerIp, Principal,
};
use crate::plan::{Plan, PlanFromExtension, PlanFromHeader, PlanMap, PlanResolver, UnknownPlan};
use crate::quota::Quota;
use crate::rate_limit::{Charge, Limit, Mode};
use crate::request::RequestView;
use crate::store::PlanQuota;

use super::model::{ChargeDoc, KeyDoc, LimitDoc, StatusOrWord};
use super::route::{RoutePattern, Routes};
use super::text::{self, CostEntry, StatusMatch};
use super::PrincipalId;

/// One step of a field path: a table key or an array index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Seg {
    Key(String),
    Index(usize),
}

/// A fault in limit `limit` (its index) at `path`.
#[derive(Debug, Clone)]
pub(crate) struct Fault {
    pub(crate) limit: usize,
    pub(crate) path: Vec<Seg>,
    pub(crate) message: String,
}

/// The dotted form of a path: `plans.free.quota`, `routes[1]`, `assign."key with space"`.
pub(crate) fn path_text(path: &[Seg]) -> String {
    let mut out = String::new();
    for seg in path {
        match seg {
            Seg::Index(i) => out.push_str(&format!("[{i}]")),
            Seg::Key(k) => {
                if !out.is_empty() {
                    out.push('.');
                }
                if !k.is_empty()
                    && k.bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
                {
                    out.push_str(k);
                } else {
                    out.push_str(&format!("{k:?}"));
                }
            }
        }
    }
    out
}

struct Ctx {
    limit: usize,
}

impl Ctx {
    fn fault(&self, path: &[&str], message: impl Into<String>) -> Fault {
        Fault {
            limit: self.limit,
            path: path.iter().map(|s| Seg::Key((*s).to_owned())).collect(),
            message: message.into(),
        }
    }

    fn fault_at(&self, path: Vec<Seg>, message: impl Into<String>) -> Fault {
        Fault {
            limit: self.limit,
            path,
            message: message.into(),
        }
    }
}

/// Compiles every limit; names are checked unique across the policy.
pub(crate) fn compile(docs: &[LimitDoc]) -> Result<Vec<Limit>, Fault> {
    let mut limits: Vec<Limit> = Vec::new();
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    for (i, doc) in docs.iter().enumerate() {
        let ctx = Ctx { limit: i };
        for limit in compile_limit(&ctx, doc)? {
            let name = limit.name().as_str().to_owned();
            if let Some(first) = seen.insert(name.clone(), i) {
                return Err(ctx.fault(
                    &["name"],
                    format!("the limit name {name:?} is already used by limit #{}; names must be unique", first + 1),
                ));
            }
            limits.push(limit);
        }
    }
    Ok(limits)
}

fn compile_limit(ctx: &Ctx, doc: &LimitDoc) -> Result<Vec<Limit>, Fault> {
    let name = doc.name.as_str();
    if name.is_empty() || !name.bytes().all(|b| (0x20..=0x7e).contains(&b)) {
        return Err(ctx.fault(&["name"], "the name must be non-empty printable ASCII (it is sent in headers and bodies), e.g. \"per-ip\""));
    }
    crate::decision::check_len("name", "the name", name)
        .map_err(|e| ctx.fault(&["name"], e.message().to_owned()))?;
    let algorithm = match &doc.algorithm {
        None => AlgorithmKind::default(),
        Some(a) => a
            .parse::<AlgorithmKind>()
            .map_err(|e| ctx.fault(&["algorithm"], e.message().to_owned()))?,
    };

    // Windows: the limit's own quota and each plan's, with the same periods.
    let own = match &doc.quota {
        Some(q) => Some(text::windows(q).map_err(|e| ctx.fault(&["quota"], e))?),
        None => None,
    };
    let mut plans: Vec<(&str, Vec<Quota>, Option<&str>)> = Vec::new();
    for (pname, pdoc) in &doc.plans {
        let field: Vec<&str> = match pdoc {
            super::model::PlanDoc::Quota(_) => vec!["plans", pname],
            super::model::PlanDoc::Table(_) => vec!["plans", pname, "quota"],
        };
        if pname.is_empty() || !pname.bytes().all(|b| (0x21..=0x7e).contains(&b)) {
            return Err(ctx.fault(&["plans", pname], format!("plan name {pname:?} must be non-empty printable ASCII without spaces, e.g. \"pro\"")));
        }
        crate::decision::check_len("plans", "the plan name", pname)
            .map_err(|e| ctx.fault(&["plans", pname], e.message().to_owned()))?;
        let windows = text::windows(pdoc.quota()).map_err(|e| ctx.fault(&field, e))?;
        plans.push((pname, windows, pdoc.link()));
    }
    let periods: Vec<_> = match (&own, plans.first()) {
        (Some(w), _) => w.iter().map(Quota::period).collect(),
        (None, Some((_, w, _))) => w.iter().map(Quota::period).collect(),
        (None, None) => {
            return Err(ctx.fault(
                &["quota"],
                "missing: give the limit a quota (quota = \"100/min\") or plans",
            ))
        }
    };
    for (pname, windows, _) in &plans {
        let theirs: Vec<_> = windows.iter().map(Quota::period).collect();
        if theirs != periods {
            let against = if own.is_some() {
                "quota"
            } else {
                "the first plan"
            };
            return Err(ctx.fault(&["plans", pname], format!(
                "its windows ({}) are not those of {against}: every plan of a limit needs the same windows (periods), one limit is made per window",
                windows.iter().map(ToString::to_string).collect::<Vec<_>>().join("; ")
            )));
        }
    }
    if let Some(default) = &doc.default_plan {
        if doc.quota.is_some() {
            return Err(ctx.fault(
                &["default_plan"],
                "set either quota or default_plan: both give requests without a plan their quota",
            ));
        }
        if !doc.plans.contains_key(default) {
            return Err(ctx.fault(
                &["default_plan"],
                format!("{default:?} is not one of this limit's plans"),
            ));
        }
    }
    // The limit's own quota per window: `quota`, the default plan's, or (when nothing can ever
    // be decided at it) the largest plan's, so that cost checks stay meaningful.
    let placeholder = own.is_none() && doc.default_plan.is_none();
    let own_windows: Vec<Quota> = match (&own, &doc.default_plan) {
        (Some(w), _) => w.clone(),
        (None, Some(d)) => plans
            .iter()
            .find(|p| p.0 == d)
            .map(|p| p.1.clone())
            .unwrap_or_default(),
        (None, None) => (0..periods.len())
            .map(|w| {
                plans
                    .iter()
                    .map(|p| p.1[w])
                    .max_by_key(Quota::burst_size)
                    .unwrap_or(Quota::per_second(1))
            })
            .collect(),
    };
    // Every quota enforceable by the algorithm, reported at its own field.
    if let Some(w) = &own {
        for q in w {
            PlanQuota::new(algorithm, *q).map_err(|e| {
                ctx.fault(&["quota"], format!("{q} with {algorithm}: {}", e.message()))
            })?;
        }
    }
    for (pname, windows, _) in &plans {
        for q in windows {
            PlanQuota::new(algorithm, *q).map_err(|e| {
                ctx.fault(
                    &["plans", pname],
                    format!("{q} with {algorithm}: {}", e.message()),
                )
            })?;
        }
    }

    let key = key_builder(ctx, doc.key.as_ref())?;
    let routes = doc
        .routes
        .iter()
        .enumerate()
        .map(|(i, r)| {
            RoutePattern::parse(r)
                .map_err(|e| ctx.fault_at(vec![Seg::Key("routes".into()), Seg::Index(i)], e))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let routes = (!routes.is_empty()).then(|| Arc::new(Routes(routes)));
    let costs = cost_table(ctx, doc)?;
    let mode = mode(ctx, doc)?;
    let on_store_error = match &doc.on_store_error {
        Some(t) => Some(text::failure_policy(t).map_err(|e| ctx.fault(&["on_store_error"], e))?),
        None => None,
    };
    let on_missing_key = match &doc.on_missing_key {
        None => MissingKey::default(),
        Some(StatusOrWord::Status(n)) => MissingKey::reject_with(
            text::refusal_status(*n).map_err(|e| ctx.fault(&["on_missing_key"], e))?,
        ),
        Some(StatusOrWord::Word(w)) if w == "reject" => MissingKey::Reject,
        Some(StatusOrWord::Word(w)) if w == "skip" => MissingKey::Skip,
        Some(StatusOrWord::Word(w)) => {
            return Err(ctx.fault(
                &["on_missing_key"],
                format!("{w:?}: write a status such as 401, \"reject\" (400) or \"skip\""),
            ))
        }
    };
    let charge = match &doc.charge {
        Some(c) => Some(charge(ctx, c)?),
        None => None,
    };
    let plan_names: Vec<&str> = plans.iter().map(|p| p.0).collect();
    let resolver = resolver(ctx, doc, &plan_names)?;
    if placeholder && (doc.plan_header.is_some() || doc.plan_extension == Some(true)) {
        return Err(ctx.fault(&["quota"], "requests that name no plan (no plan header or extension) are counted at the limit's own quota: set quota, or default_plan = \"free\""));
    }
    let on_unknown_plan = match &doc.on_unknown_plan {
        _ if plans.is_empty() && doc.on_unknown_plan.is_some() => {
            return Err(ctx.fault(&["on_unknown_plan"], "this limit has no plans; remove on_unknown_plan or add plans"))
        }
        None if placeholder && !plans.is_empty() => {
            return Err(ctx.fault(&["on_unknown_plan"], "keys without a known plan need an answer: set on_unknown_plan = 401 to refuse them, or give the limit a quota or default_plan"))
        }
        None => UnknownPlan::Default,
        Some(StatusOrWord::Status(n)) => UnknownPlan::reject(text::refusal_status(*n).map_err(|e| ctx.fault(&["on_unknown_plan"], e))?),
        Some(StatusOrWord::Word(w)) if w == "default" && placeholder => {
            return Err(ctx.fault(&["on_unknown_plan"], "\"default\" counts at the limit's own quota and this limit has none: set quota or default_plan, or refuse with a status such as 401"))
        }
        Some(StatusOrWord::Word(w)) if w == "default" => UnknownPlan::Default,
        Some(StatusOrWord::Word(w)) => {
            return Err(ctx.fault(&["on_unknown_plan"], format!("{w:?}: write a status such as 401, or \"default\"")))
        }
    };

    let several = periods.len() > 1;
    let mut out = Vec::with_capacity(periods.len());
    for (w, own_quota) in own_windows.iter().enumerate() {
        let limit_name = if several {
            format!("{name}/{}", text::period_suffix(own_quota))
        } else {
            name.to_owned()
        };
        crate::decision::check_len("name", "the name (with its window)", &limit_name)
            .map_err(|e| ctx.fault(&["name"], e.message().to_owned()))?;
        let mut limit = Limit::new(&limit_name, *own_quota)
            .algorithm(algorithm)
            .key(key.build())
            .on_missing_key(on_missing_key)
            .mode(mode)
            .on_unknown_plan(on_unknown_plan);
        for (pname, windows, link) in &plans {
            let mut plan = Plan::new(pname, windows[w]);
            if let Some(link) = link {
                plan = plan.link(*link);
            }
            limit = limit.plan(plan);
        }
        if let Some(resolver) = &resolver {
            let resolver = Arc::clone(resolver);
            limit = limit.resolve_plan(move |req: &RequestView<'_>, key: &Key<'_>| {
                resolver.resolve(req, key)
            });
        }
        if let Some(routes) = &routes {
            let routes = Arc::clone(routes);
            limit = limit.when(move |req| routes.matches(req));
        }
        if let Some(costs) = &costs {
            limit = limit.cost(costs.clone());
        }
        if let Some(policy) = on_store_error {
            limit = limit.on_store_error(policy);
        }
        if let Some(charge) = &charge {
            limit = limit.charge(charge.clone());
        }
        limit.compile().map_err(|e| {
            let field = e.field().strip_prefix("limit.").unwrap_or(e.field());
            let field = match field {
                "cost" => "costs",
                "plans.name" | "resolve_plan" => "plans",
                f if f.starts_with("quota") => "quota",
                f => f,
            };
            ctx.fault(&[field], e.message().to_owned())
        })?;
        out.push(limit);
    }
    Ok(out)
}

/// A key extractor, validated once and built per window.
enum KeyBuilder {
    Peer(PeerIp),
    Client(ClientIp),
    Header(HeaderKey),
    Principal,
    Global,
}

impl KeyBuilder {
    fn build(&self) -> Box<dyn KeyExtractor> {
        match self {
            KeyBuilder::Peer(k) => Box::new(*k),
            KeyBuilder::Client(k) => Box::new(k.clone()),
            KeyBuilder::Header(k) => Box::new(k.clone()),
            KeyBuilder::Principal => {
                Box::new(Principal::new(|p: &PrincipalId| Key::string(p.as_str())))
            }
            KeyBuilder::Global => Box::new(GlobalKey),
        }
    }
}

const KEY_HINT: &str = "write key = \"peer_ip\", \"global\", \"principal\", { header = \"x-api-key\" } or { client_ip = { trusted_proxies = [\"10.0.0.0/8\"] } }";

fn key_builder(ctx: &Ctx, doc: Option<&KeyDoc>) -> Result<KeyBuilder, Fault> {
    let Some(doc) = doc else {
        return Err(ctx.fault(
            &["key"],
            format!("missing: who is a request counted against? {KEY_HINT}"),
        ));
    };
    let table = match doc {
        KeyDoc::Name(n) => {
            return match n.as_str() {
                "peer_ip" => Ok(KeyBuilder::Peer(PeerIp::new())),
                "global" => Ok(KeyBuilder::Global),
                "principal" => Ok(KeyBuilder::Principal),
                "client_ip" => Err(ctx.fault(&["key"], "client_ip needs the proxies it may believe: key = { client_ip = { trusted_proxies = [\"10.0.0.0/8\"] } }")),
                "header" => Err(ctx.fault(&["key"], "header needs a name: key = { header = \"x-api-key\" }")),
                other => Err(ctx.fault(&["key"], format!("unknown key {other:?}: {KEY_HINT}"))),
            };
        }
        KeyDoc::Table(t) => t,
    };
    let set = usize::from(table.header.is_some())
        + usize::from(table.peer_ip.is_some())
        + usize::from(table.client_ip.is_some());
    if set != 1 {
        return Err(ctx.fault(&["key"], format!("name exactly one key: {KEY_HINT}")));
    }
    if let Some(header) = &table.header {
        return HeaderKey::new(header.as_str())
            .map(KeyBuilder::Header)
            .map_err(|e| ctx.fault(&["key", "header"], e.message().to_owned()));
    }
    if let Some(peer) = &table.peer_ip {
        let mut k = PeerIp::new();
        if let Some(p) = peer.ipv6_prefix {
            k = k.ipv6_prefix(p).map_err(|e| {
                ctx.fault(&["key", "peer_ip", "ipv6_prefix"], e.message().to_owned())
            })?;
        }
        return Ok(KeyBuilder::Peer(k));
    }
    let client = table.client_ip.as_ref().expect("exactly one key is set");
    let field = |f: &str| ["key", "client_ip", f].map(str::to_owned);
    let fault = |f: &str, m: String| ctx.fault_at(field(f).into_iter().map(Seg::Key).collect(), m);
    let mut k = ClientIp::trusting(&client.trusted_proxies)
        .map_err(|e| fault("trusted_proxies", e.message().to_owned()))?;
    if !client.headers.is_empty() {
        let headers = client
            .headers
            .iter()
            .map(|h| match h.to_ascii_lowercase().as_str() {
                "x-forwarded-for" => Ok(ForwardedHeader::XForwardedFor),
                "forwarded" => Ok(ForwardedHeader::Forwarded),
                "x-real-ip" => Ok(ForwardedHeader::XRealIp),
                _ => Err(fault("headers", format!("{h:?}: the forwarding headers read are \"x-forwarded-for\", \"forwarded\" and \"x-real-ip\""))),
            })
            .collect::<Result<Vec<_>, _>>()?;
        k = k
            .headers(headers)
            .map_err(|e| fault("headers", e.message().to_owned()))?;
    }
    if let Some(p) = client.ipv6_prefix {
        k = k
            .ipv6_prefix(p)
            .map_err(|e| fault("ipv6_prefix", e.message().to_owned()))?;
    }
    Ok(KeyBuilder::Client(k))
}

fn cost_table(ctx: &Ctx, doc: &LimitDoc) -> Result<Option<CostTable>, Fault> {
    if doc.cost.is_none() && doc.costs.is_empty() {
        return Ok(None);
    }
    let mut table = CostTable::new(doc.cost.unwrap_or(1));
    for (entry, &cost) in &doc.costs {
        table = match text::cost_entry(entry).map_err(|e| ctx.fault(&["costs", entry], e))? {
            CostEntry::Route(r) => table.route(r, cost),
            CostEntry::Method(m) => table.method(m, cost),
            CostEntry::MethodRoute(m, r) => table.method_route(m, r, cost),
        };
    }
    Ok(Some(table))
}

fn mode(ctx: &Ctx, doc: &LimitDoc) -> Result<Mode, Fault> {
    match (doc.mode.as_deref(), doc.shadow_headers) {
        (None | Some("enforce"), None) => Ok(Mode::Enforce),
        (None | Some("enforce"), Some(_)) => Err(ctx.fault(
            &["shadow_headers"],
            "only a limit with mode = \"shadow\" takes shadow_headers",
        )),
        (Some("shadow"), headers) => Ok(Mode::Shadow {
            headers: headers.unwrap_or(false),
        }),
        (Some(other), _) => Err(ctx.fault(
            &["mode"],
            format!("{other:?}: write \"enforce\" or \"shadow\""),
        )),
    }
}

fn statuses(ctx: &Ctx, field: &str, list: &[StatusOrWord]) -> Result<Arc<[StatusMatch]>, Fault> {
    if list.is_empty() {
        return Err(ctx.fault(
            &["charge", field],
            "an empty list matches no response: list statuses such as [401] or [\"5xx\"]",
        ));
    }
    list.iter()
        .enumerate()
        .map(|(i, s)| {
            match s {
                StatusOrWord::Status(n) => StatusMatch::parse_number(*n),
                StatusOrWord::Word(w) => StatusMatch::parse_text(w),
            }
            .map_err(|e| {
                ctx.fault_at(
                    vec![
                        Seg::Key("charge".into()),
                        Seg::Key(field.into()),
                        Seg::Index(i),
                    ],
                    e,
                )
            })
        })
        .collect()
}

fn charge(ctx: &Ctx, doc: &ChargeDoc) -> Result<Charge, Fault> {
    match (&doc.only_status, &doc.refund_status) {
        (Some(only), None) => {
            let only = statuses(ctx, "only_status", only)?;
            Ok(Charge::only_when(move |s| only.iter().any(|m| m.matches(s))))
        }
        (None, Some(refund)) => {
            let refund = statuses(ctx, "refund_status", refund)?;
            Ok(Charge::refund_when(move |s| refund.iter().any(|m| m.matches(s))))
        }
        _ => Err(ctx.fault(&["charge"], "write either charge = { only_status = [401] } or charge = { refund_status = [\"5xx\"] }")),
    }
}

/// The plan resolver: from `assign`, `plan_header` or `plan_extension` (exactly one with plans).
fn resolver(
    ctx: &Ctx,
    doc: &LimitDoc,
    plans: &[&str],
) -> Result<Option<Arc<dyn PlanResolver>>, Fault> {
    let mut sources: Vec<&str> = Vec::new();
    if !doc.assign.is_empty() {
        sources.push("assign");
    }
    if doc.plan_header.is_some() {
        sources.push("plan_header");
    }
    if doc.plan_extension == Some(true) {
        sources.push("plan_extension");
    }
    match (plans.is_empty(), sources.as_slice()) {
        (true, []) => Ok(None),
        (true, [first, ..]) => Err(ctx.fault(&[first], "this limit has no plans to choose from; add plans or remove it")),
        (false, []) => Err(ctx.fault(&["plans"], "nothing chooses between the plans: add assign = { \"key\" = \"plan\" }, plan_header = \"x-plan\" or plan_extension = true")),
        (false, [_, second, ..]) => Err(ctx.fault(&[second], format!("choose plans one way: {} are all set", sources.join(" and ")))),
        (false, ["assign"]) => {
            let mut map = PlanMap::new();
            for (key, plan) in &doc.assign {
                if !plans.contains(&plan.as_str()) {
                    return Err(ctx.fault(&["assign", key], format!("{plan:?} is not one of this limit's plans ({})", plans.join(", "))));
                }
                map = map.assign(key, plan);
            }
            Ok(Some(Arc::new(map)))
        }
        (false, ["plan_header"]) => {
            let header = doc.plan_header.as_deref().unwrap_or_default();
            let resolver = PlanFromHeader::new(header).map_err(|e| ctx.fault(&["plan_header"], e.message().to_owned()))?;
            Ok(Some(Arc::new(resolver.plans(plans))))
        }
        (false, _) => Ok(Some(Arc::new(PlanFromExtension::new().plans(plans)))),
    }
}
