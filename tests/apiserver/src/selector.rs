//! Label and field selectors as the API server parses them from query strings.
//!
//! Owns parsing and matching only. Labels: `k=v`, `k==v`, `k!=v`, `k`, `!k`, `k in (a,b)`,
//! `k notin (a,b)`. Fields: `path=v`, `path==v`, `path!=v` where path is a dotted JSON path such as
//! `metadata.name` or `spec.nodeName`.

use serde_json::Value;

use crate::Error;

/// One parsed label requirement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LabelReq {
    /// `k=v` / `k==v`.
    Eq(String, String),
    /// `k!=v` (also true when the label is absent).
    Ne(String, String),
    /// `k`.
    Exists(String),
    /// `!k`.
    NotExists(String),
    /// `k in (a,b)`.
    In(String, Vec<String>),
    /// `k notin (a,b)`.
    NotIn(String, Vec<String>),
}

/// A label selector: all requirements must hold.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LabelSelector(pub Vec<LabelReq>);

/// A field selector: all (path, op, value) terms must hold.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FieldSelector(pub Vec<(String, bool, String)>);

/// Splits on commas that are not inside parentheses.
fn split_terms(s: &str) -> Vec<&str> {
    let (mut out, mut depth, mut start) = (Vec::new(), 0i32, 0usize);
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                out.push(s[start..i].trim());
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(s[start..].trim());
    out.into_iter().filter(|t| !t.is_empty()).collect()
}

fn set_values(term: &str, rest: &str) -> Result<Vec<String>, Error> {
    let inner = rest
        .trim()
        .strip_prefix('(')
        .and_then(|r| r.strip_suffix(')'))
        .ok_or_else(|| {
            Error::BadRequest(format!(
                "labelSelector term {term:?}: expected a (a,b) value set"
            ))
        })?;
    Ok(inner
        .split(',')
        .map(|v| v.trim().to_string())
        .filter(|v| !v.is_empty())
        .collect())
}

fn parse_label_term(term: &str) -> Result<LabelReq, Error> {
    if let Some((k, v)) = term.split_once("!=") {
        return Ok(LabelReq::Ne(k.trim().into(), v.trim().into()));
    }
    if let Some((k, v)) = term.split_once("==").or_else(|| term.split_once('=')) {
        return Ok(LabelReq::Eq(k.trim().into(), v.trim().into()));
    }
    if let Some(k) = term.strip_prefix('!') {
        return Ok(LabelReq::NotExists(k.trim().into()));
    }
    if let Some((k, rest)) = term.split_once(" notin ") {
        return Ok(LabelReq::NotIn(k.trim().into(), set_values(term, rest)?));
    }
    if let Some((k, rest)) = term.split_once(" in ") {
        return Ok(LabelReq::In(k.trim().into(), set_values(term, rest)?));
    }
    if term.contains(char::is_whitespace) || term.contains('(') {
        return Err(Error::BadRequest(format!(
            "labelSelector term {term:?}: unknown operator"
        )));
    }
    Ok(LabelReq::Exists(term.into()))
}

impl LabelSelector {
    /// Parses the `labelSelector` query value.
    pub fn parse(s: &str) -> Result<Self, Error> {
        split_terms(s)
            .into_iter()
            .map(parse_label_term)
            .collect::<Result<_, _>>()
            .map(Self)
    }

    /// Whether an object's `metadata.labels` satisfy every requirement.
    pub fn matches(&self, obj: &Value) -> bool {
        let labels = &obj["metadata"]["labels"];
        let get = |k: &str| labels.get(k).and_then(Value::as_str);
        self.0.iter().all(|req| match req {
            LabelReq::Eq(k, v) => get(k) == Some(v.as_str()),
            LabelReq::Ne(k, v) => get(k) != Some(v.as_str()),
            LabelReq::Exists(k) => get(k).is_some(),
            LabelReq::NotExists(k) => get(k).is_none(),
            LabelReq::In(k, vs) => get(k).is_some_and(|l| vs.iter().any(|v| v == l)),
            LabelReq::NotIn(k, vs) => get(k).is_none_or(|l| vs.iter().all(|v| v != l)),
        })
    }
}

fn field_value(obj: &Value, path: &str) -> String {
    let mut cur = obj;
    for part in path.split('.') {
        cur = &cur[part];
    }
    match cur {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

impl FieldSelector {
    /// Parses the `fieldSelector` query value.
    pub fn parse(s: &str) -> Result<Self, Error> {
        let mut out = Vec::new();
        for term in split_terms(s) {
            let (path, eq, value) = if let Some((k, v)) = term.split_once("!=") {
                (k, false, v)
            } else if let Some((k, v)) = term.split_once("==").or_else(|| term.split_once('=')) {
                (k, true, v)
            } else {
                return Err(Error::BadRequest(format!(
                    "fieldSelector term {term:?}: expected path=value"
                )));
            };
            out.push((path.trim().to_string(), eq, value.trim().to_string()));
        }
        Ok(Self(out))
    }

    /// Whether the object satisfies every term.
    pub fn matches(&self, obj: &Value) -> bool {
        self.0
            .iter()
            .all(|(path, eq, value)| (field_value(obj, path) == *value) == *eq)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn obj() -> Value {
        json!({"metadata": {"name": "a", "namespace": "ns", "labels": {"app": "web", "tier": "fe"}},
               "spec": {"nodeName": "n1"}})
    }

    #[test]
    fn label_selector_cases() {
        let cases = [
            ("app=web", true),
            ("app==web", true),
            ("app=db", false),
            ("app!=db", true),
            ("app!=web", false),
            ("missing!=x", true),
            ("app", true),
            ("missing", false),
            ("!missing", true),
            ("!app", false),
            ("app in (db, web)", true),
            ("app in (db)", false),
            ("app notin (db)", true),
            ("missing notin (db)", true),
            ("app=web,tier=fe", true),
            ("app=web,tier=be", false),
            ("app in (a,web),tier", true),
        ];
        for (sel, want) in cases {
            assert_eq!(
                LabelSelector::parse(sel).unwrap().matches(&obj()),
                want,
                "selector {sel}"
            );
        }
    }

    #[test]
    fn field_selector_cases() {
        let cases = [
            ("metadata.name=a", true),
            ("metadata.name==b", false),
            ("metadata.namespace!=ns", false),
            ("spec.nodeName=n1,metadata.name=a", true),
            ("spec.nodeName=", false),
            ("spec.missing=", true),
        ];
        for (sel, want) in cases {
            assert_eq!(
                FieldSelector::parse(sel).unwrap().matches(&obj()),
                want,
                "selector {sel}"
            );
        }
    }

    #[test]
    fn bad_selectors_are_errors() {
        assert!(LabelSelector::parse("app in web").is_err());
        assert!(FieldSelector::parse("metadata.name").is_err());
    }
}
