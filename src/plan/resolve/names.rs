//! A bounded memo from plan names read at run time to interned [`PolicyName`]s.

use std::collections::HashMap;
use std::fmt;

use parking_lot::RwLock;

use crate::decision::PolicyName;
use crate::plan::Resolution;

/// At most this many distinct names are interned from requests by one resolver.
pub(crate) const MAX_NAMES: usize = 256;
/// Longer names are not plan names.
const MAX_NAME_LEN: usize = 64;

/// Plan names seen at run time, interned at most once each and at most [`MAX_NAMES`] of them
/// (interned names live for the process, so an open memo must be bounded).
pub(crate) struct PlanNames {
    names: RwLock<HashMap<Box<str>, PolicyName, foldhash::fast::RandomState>>,
    /// Whether unseen names may still be added (false once restricted to a fixed list).
    open: bool,
}

impl PlanNames {
    /// A memo that accepts any plausible name, up to [`MAX_NAMES`].
    pub(crate) fn open() -> Self {
        Self {
            names: RwLock::new(HashMap::default()),
            open: true,
        }
    }

    /// A memo that knows exactly `names`.
    pub(crate) fn fixed<I>(names: I) -> Self
    where
        I: IntoIterator,
        I::Item: AsRef<str>,
    {
        let names = names
            .into_iter()
            .map(|n| (Box::from(n.as_ref()), PolicyName::new(n)))
            .collect();
        Self {
            names: RwLock::new(names),
            open: false,
        }
    }

    /// The interned name, or `None` when `name` is not (and cannot become) a known plan name.
    pub(crate) fn get(&self, name: &str) -> Option<PolicyName> {
        if let Some(found) = self.names.read().get(name) {
            return Some(*found);
        }
        if !self.open
            || name.is_empty()
            || name.len() > MAX_NAME_LEN
            || !name.bytes().all(|b| (0x21..=0x7e).contains(&b))
        {
            return None;
        }
        let mut names = self.names.write();
        if let Some(found) = names.get(name) {
            return Some(*found);
        }
        if names.len() >= MAX_NAMES {
            tracing::debug!(
                max = MAX_NAMES,
                "plan resolver: too many distinct plan names; treating a new one as unknown"
            );
            return None;
        }
        let interned = PolicyName::new(name);
        names.insert(Box::from(name), interned);
        Some(interned)
    }

    /// `Plan(name)` when the name is known, else `Unknown`.
    pub(crate) fn resolve(&self, name: &str) -> Resolution {
        match self.get(name) {
            Some(plan) => Resolution::Plan(plan),
            None => Resolution::Unknown,
        }
    }
}

impl fmt::Debug for PlanNames {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names = self.names.read();
        let mut list: Vec<&str> = names.keys().map(|k| &**k).collect();
        list.sort_unstable();
        f.debug_struct("PlanNames")
            .field("names", &list)
            .field("open", &self.open)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn open_memo_is_bounded_and_rejects_implausible_names() {
        let names = PlanNames::open();
        assert_eq!(names.get("pro").unwrap().as_str(), "pro");
        assert_eq!(names.get("pro"), names.get("pro"));
        for bad in ["", "has space", "caf\u{e9}", &"x".repeat(65)] {
            assert!(names.get(bad).is_none(), "{bad:?}");
        }
        for i in 1..MAX_NAMES {
            assert!(names.get(&format!("names-test-plan-{i}")).is_some());
        }
        // Full: a new name is unknown, known ones still resolve.
        assert!(names.get("one-too-many").is_none());
        assert!(names.get("pro").is_some());
        assert!(names.get("names-test-plan-7").is_some());
    }

    #[test]
    fn fixed_memo_knows_only_its_names() {
        let names = PlanNames::fixed(["free", "pro"]);
        assert!(names.get("free").is_some());
        assert!(names.get("enterprise").is_none());
        assert!(format!("{names:?}").contains("\"free\", \"pro\""));
    }
}
