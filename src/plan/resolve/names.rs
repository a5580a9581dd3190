//! Which plan names read at run time a resolver accepts.

use std::fmt;

use crate::decision::Name;
use crate::plan::Resolution;

/// The plan names a resolver accepts from requests: any plausible name, or a fixed list.
///
/// A [`Name`] holds its text inline, so accepting a name read from a request keeps
/// nothing: no memo, no lock, no memory that grows with the names clients send.
pub(crate) struct PlanNames {
    /// `None`: any plausible name. Otherwise exactly these (a short list, searched in order).
    fixed: Option<Box<[Name]>>,
}

impl PlanNames {
    /// Accepts any plausible name: non-empty printable ASCII without spaces, at most
    /// [`Name::MAX_LEN`] bytes.
    pub(crate) fn open() -> Self {
        Self { fixed: None }
    }

    /// Accepts exactly `names` (those that are plausible plan names; a longer or non-ASCII one
    /// could not name a limit's plan anyway).
    pub(crate) fn fixed<I>(names: I) -> Self
    where
        I: IntoIterator,
        I::Item: AsRef<str>,
    {
        let mut list: Vec<Name> = Vec::new();
        for name in names {
            let name = name.as_ref();
            if plausible(name) {
                let name = Name::new(name);
                if !list.contains(&name) {
                    list.push(name);
                }
            }
        }
        Self {
            fixed: Some(list.into_boxed_slice()),
        }
    }

    /// The name, or `None` when `name` is not an accepted plan name.
    pub(crate) fn get(&self, name: &str) -> Option<Name> {
        if !plausible(name) {
            return None;
        }
        let name = Name::new(name);
        match &self.fixed {
            None => Some(name),
            Some(list) => list.contains(&name).then_some(name),
        }
    }

    /// `Plan(name)` when the name is accepted, else `Unknown`.
    pub(crate) fn resolve(&self, name: &str) -> Resolution {
        match self.get(name) {
            Some(plan) => Resolution::Plan(plan),
            None => Resolution::Unknown,
        }
    }
}

/// Whether `name` can be a plan's name (as a limit's plans are checked when it is built).
fn plausible(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= Name::MAX_LEN
        && name.bytes().all(|b| (0x21..=0x7e).contains(&b))
}

impl fmt::Debug for PlanNames {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let list = self.fixed.as_ref().map(|list| {
            let mut list: Vec<&str> = list.iter().map(Name::as_str).collect();
            list.sort_unstable();
            list
        });
        f.debug_struct("PlanNames")
            .field("names", &list)
            .field("open", &self.fixed.is_none())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn open_names_accept_any_plausible_name_and_keep_none() {
        let names = PlanNames::open();
        assert_eq!(names.get("pro").unwrap().as_str(), "pro");
        assert_eq!(names.get("pro"), names.get("pro"));
        let longest = "x".repeat(Name::MAX_LEN);
        for bad in ["", "has space", "caf\u{e9}", &"x".repeat(Name::MAX_LEN + 1)] {
            assert!(names.get(bad).is_none(), "{bad:?}");
        }
        assert_eq!(names.get(&longest).unwrap().as_str(), longest);
        // Any number of distinct names: nothing is kept, so nothing to bound.
        for i in 0..10_000 {
            let name = format!("names-test-plan-{i}");
            assert_eq!(names.get(&name).unwrap().as_str(), name);
        }
        assert!(format!("{names:?}").contains("open: true"));
    }

    #[test]
    fn fixed_names_know_only_their_names() {
        let names = PlanNames::fixed(["free", "pro", "free", "has space"]);
        assert!(names.get("free").is_some());
        assert!(names.get("enterprise").is_none());
        assert!(names.get("has space").is_none());
        assert!(format!("{names:?}").contains("\"free\", \"pro\""));
    }
}
