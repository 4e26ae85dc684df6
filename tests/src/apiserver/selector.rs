//! Label and field selectors of list and watch requests, in the subset controllers send:
//! `k=v`, `k==v`, `k!=v`, `k` (exists) and `!k` (absent), joined by commas; field selectors on
//! `metadata.name` and `metadata.namespace`.

use serde_json::Value;

#[derive(Debug, Clone, PartialEq, Eq)]
enum Term {
    Equals(String, String),
    NotEquals(String, String),
    Exists(String),
    Absent(String),
}

/// A parsed selector: every term must hold.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Selector {
    terms: Vec<Term>,
}

impl Selector {
    /// Parses the selector text; set-based terms (`in`, `notin`) are refused so a test that
    /// needs them fails loudly instead of matching everything.
    pub fn parse(text: &str) -> Result<Self, String> {
        let mut terms = Vec::new();
        for raw in text.split(',').map(str::trim).filter(|t| !t.is_empty()) {
            if raw.contains(" in ") || raw.contains(" notin ") || raw.contains('(') {
                return Err(format!("unsupported set-based selector term {raw:?}"));
            }
            let term = if let Some((k, v)) = raw.split_once("!=") {
                Term::NotEquals(k.trim().into(), v.trim().into())
            } else if let Some((k, v)) = raw.split_once("==") {
                Term::Equals(k.trim().into(), v.trim().into())
            } else if let Some((k, v)) = raw.split_once('=') {
                Term::Equals(k.trim().into(), v.trim().into())
            } else if let Some(k) = raw.strip_prefix('!') {
                Term::Absent(k.trim().into())
            } else {
                Term::Exists(raw.into())
            };
            terms.push(term);
        }
        Ok(Self { terms })
    }

    /// Whether `lookup(key)` satisfies every term.
    fn matches_with<'a>(&self, lookup: impl Fn(&str) -> Option<&'a str>) -> bool {
        self.terms.iter().all(|term| match term {
            Term::Equals(k, v) => lookup(k) == Some(v.as_str()),
            Term::NotEquals(k, v) => lookup(k) != Some(v.as_str()),
            Term::Exists(k) => lookup(k).is_some(),
            Term::Absent(k) => lookup(k).is_none(),
        })
    }

    pub fn matches_labels(&self, object: &Value) -> bool {
        let labels = &object["metadata"]["labels"];
        self.matches_with(|key| labels.get(key).and_then(Value::as_str))
    }

    /// Field selectors: only the metadata fields the kube watcher uses for single objects.
    pub fn matches_fields(&self, object: &Value) -> bool {
        self.matches_with(|key| match key {
            "metadata.name" => object["metadata"]["name"].as_str(),
            "metadata.namespace" => object["metadata"]["namespace"].as_str(),
            _ => None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn equality_inequality_and_existence() {
        let object = json!({"metadata": {"name": "a", "labels": {"app": "relay", "tier": "x"}}});
        let matches = |s: &str| Selector::parse(s).unwrap().matches_labels(&object);
        assert!(matches(""));
        assert!(matches("app=relay"));
        assert!(matches("app==relay,tier"));
        assert!(matches("app!=other,!missing"));
        assert!(!matches("app=other"));
        assert!(!matches("tier,missing"));
        assert!(Selector::parse("app in (a,b)").is_err());
        let by_name = Selector::parse("metadata.name=a").unwrap();
        assert!(by_name.matches_fields(&object));
    }
}
