//! JSON patch (RFC 6902) as the fake API server applies it to a stored
//! object: the `test`, `remove`, `add` and `replace` operations on JSON
//! pointers (RFC 6901), all or nothing (a failing operation leaves the
//! object unchanged), which is what makes a `test` a precondition.

use serde_json::Value;

/// Applies `patch` (an array of operations) to `doc`, or changes nothing
/// and says which operation failed.
pub fn apply(doc: &mut Value, patch: &Value) -> Result<(), String> {
    let ops = patch
        .as_array()
        .ok_or("a JSON patch must be an array of operations")?;
    let mut work = doc.clone();
    for (n, op) in ops.iter().enumerate() {
        apply_one(&mut work, op).map_err(|e| format!("operation {n} ({op}): {e}"))?;
    }
    *doc = work;
    Ok(())
}

fn apply_one(doc: &mut Value, op: &Value) -> Result<(), String> {
    let kind = op["op"].as_str().ok_or("no \"op\"")?;
    let path = op["path"].as_str().ok_or("no \"path\"")?;
    let tokens = pointer_tokens(path)?;
    match kind {
        "test" => {
            let want = op.get("value").ok_or("no \"value\"")?;
            match doc.pointer(path) {
                Some(v) if v == want => Ok(()),
                Some(v) => Err(format!("test failed: {path} is {v}, not {want}")),
                None => Err(format!("test failed: {path} does not exist")),
            }
        }
        "remove" => {
            let (parent, last) = parent_of(doc, &tokens)?;
            match parent {
                Value::Object(m) => m
                    .shift_remove(last)
                    .map(|_| ())
                    .ok_or_else(|| format!("{path} does not exist")),
                Value::Array(a) => {
                    let i = index(last, a.len())?;
                    a.remove(i);
                    Ok(())
                }
                _ => Err(format!("the parent of {path} is not a container")),
            }
        }
        "add" | "replace" => {
            let value = op.get("value").ok_or("no \"value\"")?.clone();
            if tokens.is_empty() {
                *doc = value;
                return Ok(());
            }
            let (parent, last) = parent_of(doc, &tokens)?;
            match parent {
                Value::Object(m) => {
                    if kind == "replace" && !m.contains_key(last) {
                        return Err(format!("{path} does not exist"));
                    }
                    m.insert(last.to_string(), value);
                    Ok(())
                }
                Value::Array(a) if kind == "add" && last == "-" => {
                    a.push(value);
                    Ok(())
                }
                Value::Array(a) if kind == "add" => {
                    let i = index(last, a.len() + 1)?;
                    a.insert(i, value);
                    Ok(())
                }
                Value::Array(a) => {
                    let i = index(last, a.len())?;
                    a[i] = value;
                    Ok(())
                }
                _ => Err(format!("the parent of {path} is not a container")),
            }
        }
        other => Err(format!("unsupported operation {other:?}")),
    }
}

fn pointer_tokens(path: &str) -> Result<Vec<String>, String> {
    if path.is_empty() {
        return Ok(vec![]);
    }
    let rest = path
        .strip_prefix('/')
        .ok_or_else(|| format!("{path:?} is not a JSON pointer"))?;
    Ok(rest
        .split('/')
        .map(|t| t.replace("~1", "/").replace("~0", "~"))
        .collect())
}

fn parent_of<'a, 'b>(
    doc: &'a mut Value,
    tokens: &'b [String],
) -> Result<(&'a mut Value, &'b str), String> {
    let (last, init) = tokens.split_last().ok_or("the root has no parent")?;
    let mut cur = doc;
    for t in init {
        cur = match cur {
            Value::Object(m) => m.get_mut(t.as_str()),
            Value::Array(a) => {
                let i = index(t, a.len())?;
                a.get_mut(i)
            }
            _ => None,
        }
        .ok_or_else(|| format!("/{} does not exist", init.join("/")))?;
    }
    Ok((cur, last))
}

/// An array index below `len`.
fn index(token: &str, len: usize) -> Result<usize, String> {
    match token.parse::<usize>() {
        Ok(i) if i < len && (token == "0" || !token.starts_with('0')) => Ok(i),
        _ => Err(format!("index {token:?} out of range (length {len})")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn test_guards_the_whole_patch() {
        let mut doc = json!({"spec": {"taints": [{"key": "a"}, {"key": "b"}]}});
        let remove_b = json!([
            {"op": "test", "path": "/spec/taints/1/key", "value": "b"},
            {"op": "remove", "path": "/spec/taints/1"},
        ]);
        apply(&mut doc, &remove_b).unwrap();
        assert_eq!(doc, json!({"spec": {"taints": [{"key": "a"}]}}));
        // Index 1 is gone now: the test fails and nothing changes.
        let before = doc.clone();
        assert!(
            apply(&mut doc, &remove_b)
                .unwrap_err()
                .contains("test failed")
        );
        assert_eq!(doc, before);
        // A test that passes followed by a failing op: nothing changes.
        let half = json!([
            {"op": "remove", "path": "/spec/taints/0"},
            {"op": "remove", "path": "/spec/nope"},
        ]);
        assert!(apply(&mut doc, &half).is_err());
        assert_eq!(doc, before);
    }

    #[test]
    fn add_replace_and_escapes() {
        let mut doc = json!({"a/b": [1, 3], "m": {"~k": 1}});
        apply(
            &mut doc,
            &json!([
                {"op": "add", "path": "/a~1b/1", "value": 2},
                {"op": "add", "path": "/a~1b/-", "value": 4},
                {"op": "replace", "path": "/m/~0k", "value": 2},
            ]),
        )
        .unwrap();
        assert_eq!(doc, json!({"a/b": [1, 2, 3, 4], "m": {"~k": 2}}));
        assert!(
            apply(
                &mut doc,
                &json!([{"op": "replace", "path": "/x", "value": 1}])
            )
            .is_err()
        );
        assert!(apply(&mut doc, &json!([{"op": "remove", "path": "/a~1b/01"}])).is_err());
        assert!(apply(&mut doc, &json!({"op": "remove"})).is_err());
    }
}
