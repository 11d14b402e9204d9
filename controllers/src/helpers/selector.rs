//! Label selectors (`metav1.LabelSelector`: matchLabels plus matchExpressions) as the workload
//! controllers use them: converted once into a [`Selector`] that matches label maps.
//!
//! Semantics are the API server's: an empty selector (`{}`) matches everything, a missing one
//! (`None`) matches nothing; operators In, NotIn, Exists, DoesNotExist. An invalid selector (an
//! unknown operator, In/NotIn without values, Exists with values) is an error naming the field, and
//! controllers treat the object as matching nothing, as upstream does.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

/// One requirement of a selector.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Requirement {
    Equals(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    DoesNotExist(String),
}

/// A parsed label selector.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Selector {
    requirements: Vec<Requirement>,
    /// `None` as input: matches nothing.
    nothing: bool,
}

impl Selector {
    /// A selector that matches nothing (`labels.Nothing()`).
    pub fn nothing() -> Selector {
        Selector {
            requirements: Vec::new(),
            nothing: true,
        }
    }

    /// A selector matching every `key=value` pair of `labels` (`SelectorFromSet`); an empty map
    /// matches everything.
    pub fn from_labels(labels: &BTreeMap<String, String>) -> Selector {
        Selector {
            requirements: labels
                .iter()
                .map(|(k, v)| Requirement::Equals(k.clone(), v.clone()))
                .collect(),
            nothing: false,
        }
    }

    /// Converts an API selector (`LabelSelectorAsSelector`). `None` matches nothing; `{}` matches
    /// everything.
    pub fn parse(sel: Option<&LabelSelector>) -> Result<Selector, String> {
        let Some(sel) = sel else {
            return Ok(Selector::nothing());
        };
        let mut requirements = Vec::new();
        for (k, v) in sel.match_labels.iter().flatten() {
            requirements.push(Requirement::Equals(k.clone(), v.clone()));
        }
        for (i, e) in sel.match_expressions.iter().flatten().enumerate() {
            let values = e.values.clone().unwrap_or_default();
            let field = || format!("selector.matchExpressions[{i}]");
            let req = match e.operator.as_str() {
                "In" | "NotIn" if values.is_empty() => {
                    return Err(format!(
                        "{}: operator {} needs at least one value",
                        field(),
                        e.operator
                    ))
                }
                "In" => Requirement::In(e.key.clone(), values),
                "NotIn" => Requirement::NotIn(e.key.clone(), values),
                "Exists" | "DoesNotExist" if !values.is_empty() => {
                    return Err(format!(
                        "{}: operator {} takes no values",
                        field(),
                        e.operator
                    ))
                }
                "Exists" => Requirement::Exists(e.key.clone()),
                "DoesNotExist" => Requirement::DoesNotExist(e.key.clone()),
                other => {
                    return Err(format!(
                        "{}.operator: {other:?} is not one of In, NotIn, Exists, DoesNotExist",
                        field()
                    ))
                }
            };
            requirements.push(req);
        }
        Ok(Selector {
            requirements,
            nothing: false,
        })
    }

    /// Parses a selector in its string form (`labels.Parse`), as a Scale's `status.selector`
    /// carries it: requirements separated by commas, each `key`, `!key`, `key=value`,
    /// `key==value`, `key!=value`, `key in (a,b)` or `key notin (a,b)`. The empty string matches
    /// everything. `key>n` / `key<n` (which no workload's selector produces) and anything
    /// malformed are an error quoting the requirement.
    pub fn parse_string(s: &str) -> Result<Selector, String> {
        let mut requirements = Vec::new();
        for part in split_requirements(s) {
            let part = part.trim();
            if part.is_empty() {
                if s.trim().is_empty() {
                    continue;
                }
                return Err(format!("found an empty requirement in {s:?}"));
            }
            requirements.push(parse_requirement(part)?);
        }
        Ok(Selector {
            requirements,
            nothing: false,
        })
    }

    /// Whether `labels` satisfy every requirement (`None` labels are the empty map).
    pub fn matches(&self, labels: Option<&BTreeMap<String, String>>) -> bool {
        if self.nothing {
            return false;
        }
        let empty = BTreeMap::new();
        let labels = labels.unwrap_or(&empty);
        self.requirements.iter().all(|r| match r {
            Requirement::Equals(k, v) => labels.get(k) == Some(v),
            Requirement::In(k, vs) => labels.get(k).is_some_and(|v| vs.contains(v)),
            Requirement::NotIn(k, vs) => labels.get(k).is_none_or(|v| !vs.contains(v)),
            Requirement::Exists(k) => labels.contains_key(k),
            Requirement::DoesNotExist(k) => !labels.contains_key(k),
        })
    }

    /// Whether this selector matches everything (`{}`).
    pub fn is_everything(&self) -> bool {
        !self.nothing && self.requirements.is_empty()
    }

    /// One `key=value` the selector requires, if any: a cache index key that narrows the
    /// candidates before `matches`.
    pub fn an_equality(&self) -> Option<(&str, &str)> {
        self.requirements.iter().find_map(|r| match r {
            Requirement::Equals(k, v) => Some((k.as_str(), v.as_str())),
            Requirement::In(k, vs) if vs.len() == 1 => Some((k.as_str(), vs[0].as_str())),
            _ => None,
        })
    }
}

/// The comma-separated parts of a selector string, commas inside `( )` kept.
fn split_requirements(s: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0i32, 0);
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&s[start..]);
    parts
}

/// One requirement of a selector string.
fn parse_requirement(part: &str) -> Result<Requirement, String> {
    let bad = |why: &str| format!("unable to parse requirement {part:?}: {why}");
    let valid_key = |k: &str| {
        !k.is_empty()
            && k.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/'))
    };
    if let Some(key) = part.strip_prefix('!') {
        let key = key.trim();
        return valid_key(key)
            .then(|| Requirement::DoesNotExist(key.to_string()))
            .ok_or_else(|| bad("invalid key"));
    }
    for (op, negate) in [("!=", true), ("==", false), ("=", false)] {
        if let Some((k, v)) = part.split_once(op) {
            let (k, v) = (k.trim(), v.trim());
            if !valid_key(k) {
                return Err(bad("invalid key"));
            }
            return Ok(if negate {
                Requirement::NotIn(k.to_string(), vec![v.to_string()])
            } else {
                Requirement::Equals(k.to_string(), v.to_string())
            });
        }
    }
    if part.contains('>') || part.contains('<') {
        return Err(bad("the gt and lt operators are not supported"));
    }
    if let Some(open) = part.find('(') {
        let close = part
            .rfind(')')
            .filter(|c| *c > open && part[c + 1..].trim().is_empty())
            .ok_or_else(|| bad("missing ')'"))?;
        let head: Vec<&str> = part[..open].split_whitespace().collect();
        let [key, op] = head[..] else {
            return Err(bad("expected `key in (...)` or `key notin (...)`"));
        };
        if !valid_key(key) {
            return Err(bad("invalid key"));
        }
        let values: Vec<String> = part[open + 1..close]
            .split(',')
            .map(|v| v.trim().to_string())
            .collect();
        return match op {
            "in" => Ok(Requirement::In(key.to_string(), values)),
            "notin" => Ok(Requirement::NotIn(key.to_string(), values)),
            other => Err(bad(&format!("unknown operator {other:?}"))),
        };
    }
    valid_key(part)
        .then(|| Requirement::Exists(part.to_string()))
        .ok_or_else(|| bad("invalid key"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn selectors_match_as_the_api_server_does() {
        let l = labels(&[("app", "web"), ("tier", "front")]);
        let cases: &[(&str, serde_json::Value, bool)] = &[
            ("empty matches everything", json!({}), true),
            (
                "matchLabels equal",
                json!({"matchLabels": {"app": "web"}}),
                true,
            ),
            (
                "matchLabels differ",
                json!({"matchLabels": {"app": "db"}}),
                false,
            ),
            (
                "In",
                json!({"matchExpressions": [{"key": "tier", "operator": "In", "values": ["front", "x"]}]}),
                true,
            ),
            (
                "NotIn excludes",
                json!({"matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["front"]}]}),
                false,
            ),
            (
                "NotIn on a missing key matches",
                json!({"matchExpressions": [{"key": "zone", "operator": "NotIn", "values": ["a"]}]}),
                true,
            ),
            (
                "Exists",
                json!({"matchExpressions": [{"key": "app", "operator": "Exists"}]}),
                true,
            ),
            (
                "DoesNotExist",
                json!({"matchExpressions": [{"key": "app", "operator": "DoesNotExist"}]}),
                false,
            ),
        ];
        for (name, sel, want) in cases {
            let sel: LabelSelector = serde_json::from_value(sel.clone()).unwrap();
            let s = Selector::parse(Some(&sel)).unwrap();
            assert_eq!(s.matches(Some(&l)), *want, "{name}");
        }
        assert!(!Selector::parse(None).unwrap().matches(Some(&l)));
    }

    #[test]
    fn invalid_selectors_name_the_field() {
        let sel: LabelSelector =
            serde_json::from_value(json!({"matchExpressions": [{"key": "a", "operator": "In"}, ]}))
                .unwrap();
        let err = Selector::parse(Some(&sel)).unwrap_err();
        assert!(err.contains("selector.matchExpressions[0]"), "{err}");
        let sel: LabelSelector = serde_json::from_value(
            json!({"matchExpressions": [{"key": "a", "operator": "Gt", "values": ["1"]}]}),
        )
        .unwrap();
        let err = Selector::parse(Some(&sel)).unwrap_err();
        assert!(err.contains(".operator: \"Gt\""), "{err}");
    }

    #[test]
    fn selector_strings_parse_as_labels_parse_does() {
        let l = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        let s =
            Selector::parse_string("app=web,tier in (a, b),!canary,env notin (prod),x").unwrap();
        assert!(s.matches(Some(&l(&[("app", "web"), ("tier", "b"), ("x", "")]))));
        assert!(!s.matches(Some(&l(&[("app", "web"), ("tier", "c"), ("x", "")]))));
        assert!(!s.matches(Some(&l(&[("app", "web"), ("tier", "a")]))));
        assert!(!s.matches(Some(&l(&[
            ("app", "web"),
            ("tier", "a"),
            ("x", ""),
            ("canary", "1")
        ]))));
        assert!(!s.matches(Some(&l(&[
            ("app", "web"),
            ("tier", "a"),
            ("x", ""),
            ("env", "prod")
        ]))));
        let ne = Selector::parse_string("app!=web,k==v").unwrap();
        assert!(ne.matches(Some(&l(&[("k", "v")]))));
        assert!(!ne.matches(Some(&l(&[("app", "web"), ("k", "v")]))));
        assert!(Selector::parse_string("").unwrap().is_everything());
        for bad in ["a>1", "app in (x", "a,,b", "k in", "=v"] {
            assert!(Selector::parse_string(bad).is_err(), "{bad}");
        }
    }
}
