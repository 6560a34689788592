//! CEL over Kubernetes objects, the way Kubernetes writes it (ValidatingAdmissionPolicy,
//! CRD validation rules): the object as `object`, `has()`, the string functions and the
//! list macros (`all`, `exists`, `exists_one`, `map`, `filter`), through the `cel` crate.
//!
//! A PR is hostile input, so an expression is bounded before it runs: its source size, its
//! nesting (the parser's own recursion limit), how many macros it may use (each is a loop
//! over a list), and how long a list it may loop over. Together these cap one evaluation at
//! about a million steps per object; the rollout's adapter also runs it on a blocking thread
//! with a time budget, so a case these bounds miss still cannot hold the engine.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

use cel::objects::Key;
use cel::{Context, Env, Program, Value};

use super::Reading;
use crate::releaseset::excerpt;

/// The longest expression accepted.
pub const MAX_EXPRESSION_BYTES: usize = 4096;
/// Macros (loops) one expression may use: two nested loops over lists of at most
/// [`MAX_LIST_ITEMS`] is a million steps; a third would be a billion.
pub const MAX_COMPREHENSIONS: usize = 2;
/// The longest list in an object an expression may see; a longer one fails the check
/// (no Kubernetes status a health check reads is that long).
pub const MAX_LIST_ITEMS: usize = 1000;

const MACROS: [&str; 5] = [".all(", ".exists(", ".exists_one(", ".map(", ".filter("];

/// Why an expression was refused, with its position in the expression when CEL gives one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CelError {
    pub message: String,
    /// (line, column) in the expression, 1-based.
    pub position: Option<(usize, usize)>,
}

fn env() -> Arc<Env> {
    static ENV: OnceLock<Arc<Env>> = OnceLock::new();
    ENV.get_or_init(|| {
        let mut env = Env::stdlib();
        // Kubernetes' CEL has the strings extension (lowerAscii, split, …); the standard
        // environment already has size, contains, startsWith, endsWith and matches.
        if env.add_extension(cel::extensions::strings).is_err() {
            tracing::warn!("the CEL strings extension could not be added");
        }
        Arc::new(env)
    })
    .clone()
}

/// Compile `source` under the bounds above.
pub fn compile(source: &str) -> Result<Program, CelError> {
    let plain = |message: String| CelError {
        message,
        position: None,
    };
    if source.trim().is_empty() {
        return Err(plain(
            "the expression is empty; expected a CEL expression giving a bool, e.g. object.status.readyInstances == object.spec.instances".into(),
        ));
    }
    if source.len() > MAX_EXPRESSION_BYTES {
        return Err(plain(format!(
            "the expression is {} bytes; at most {MAX_EXPRESSION_BYTES} are allowed",
            source.len()
        )));
    }
    // Counted in the text (a macro name inside a string literal counts too: erring on the
    // side of refusing).
    let loops: usize = MACROS.iter().map(|m| source.matches(m).count()).sum();
    if loops > MAX_COMPREHENSIONS {
        return Err(plain(format!(
            "the expression uses {loops} list macros (all, exists, exists_one, map, filter); at most {MAX_COMPREHENSIONS} are allowed, so it stays cheap to evaluate"
        )));
    }
    env().compile(source).map_err(|e| {
        let first = e.errors.first();
        let position = first.and_then(|p| {
            let (l, c) = p.pos;
            (l >= 1).then_some((l as usize, c.max(0) as usize + 1))
        });
        CelError {
            message: format!(
                "the CEL expression does not compile: {}",
                excerpt(
                    &first
                        .map(|p| p.msg.clone())
                        .unwrap_or_else(|| e.to_string()),
                    300
                )
            ),
            position,
        }
    })
}

/// A JSON object as CEL sees it: integers as `int` (Kubernetes' int64), maps keyed by
/// string. Fails on a list longer than [`MAX_LIST_ITEMS`].
fn to_cel(v: &serde_json::Value, path: &mut String) -> Result<Value, String> {
    use serde_json::Value as J;
    Ok(match v {
        J::Null => Value::Null,
        J::Bool(b) => Value::Bool(*b),
        J::Number(n) => match (n.as_i64(), n.as_u64(), n.as_f64()) {
            (Some(i), _, _) => Value::Int(i),
            (None, Some(u), _) => Value::UInt(u),
            (_, _, Some(f)) => Value::Float(f),
            _ => Value::Null,
        },
        J::String(s) => Value::String(Arc::new(s.clone())),
        J::Array(items) => {
            if items.len() > MAX_LIST_ITEMS {
                return Err(format!(
                    "{} has {} items; a check reads lists of at most {MAX_LIST_ITEMS}",
                    if path.is_empty() { "object" } else { path },
                    items.len()
                ));
            }
            let mut out = Vec::with_capacity(items.len());
            for i in items {
                out.push(to_cel(i, path)?);
            }
            Value::List(Arc::new(out))
        }
        J::Object(m) => {
            let mut out: HashMap<Key, Value> = HashMap::with_capacity(m.len());
            for (k, v) in m {
                let len = path.len();
                path.push('.');
                path.push_str(k);
                let v = to_cel(v, path);
                path.truncate(len);
                out.insert(Key::from(k.as_str()), v?);
            }
            Value::from(out)
        }
    })
}

fn type_name(v: &Value) -> String {
    v.type_of().to_string()
}

/// One object's identity for a reading: `namespace/name`.
pub fn object_name(o: &serde_json::Value) -> String {
    let f = |p: &str| o.pointer(p).and_then(|v| v.as_str()).unwrap_or("");
    match f("/metadata/namespace") {
        "" => f("/metadata/name").to_string(),
        ns => format!("{ns}/{}", f("/metadata/name")),
    }
}

/// Evaluate `program` against each of `objects`: the check passes when it gives `true` for
/// every one (and there is at least one). Anything but a bool is a failure naming the type.
pub fn evaluate(program: &Program, objects: &[serde_json::Value]) -> Reading {
    if objects.is_empty() {
        return Reading::fail("no such object", "no object matched");
    }
    let env = env();
    let mut read = Vec::new();
    for o in objects {
        let name = object_name(o);
        let status = o
            .get("status")
            .map(|s| excerpt(&s.to_string(), 240))
            .unwrap_or_else(|| "no status".into());
        read.push(format!("{name} status {status}"));
        let value = match to_cel(o, &mut String::new()) {
            Ok(v) => v,
            Err(why) => return Reading::fail(format!("error: {why}"), read.join("; ")),
        };
        let mut ctx = Context::with_env(env.clone());
        ctx.add_variable_from_value("object", value);
        match program.execute(&ctx) {
            Ok(Value::Bool(true)) => {}
            Ok(Value::Bool(false)) => {
                let value = if objects.len() > 1 {
                    format!("false for {name}")
                } else {
                    "false".into()
                };
                return Reading::fail(value, read.join("; "));
            }
            Ok(other) => {
                return Reading::fail(
                    format!(
                        "error: the expression gave a {}, not a bool",
                        type_name(&other)
                    ),
                    read.join("; "),
                )
            }
            Err(e) => {
                return Reading::fail(
                    format!("error: {}", excerpt(&e.to_string(), 200)),
                    read.join("; "),
                )
            }
        }
    }
    Reading::pass("true", excerpt(&read.join("; "), 600))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn run(expr: &str, o: serde_json::Value) -> Reading {
        evaluate(&compile(expr).unwrap(), &[o])
    }

    fn cnpg(ready: i64) -> serde_json::Value {
        json!({"apiVersion": "postgresql.cnpg.io/v1", "kind": "Cluster",
               "metadata": {"name": "main", "namespace": "db", "labels": {"app": "pg"}},
               "spec": {"instances": 3},
               "status": {"readyInstances": ready, "phase": "Cluster in healthy state",
                          "conditions": [{"type": "Ready", "status": if ready == 3 {"True"} else {"False"}}]}})
    }

    #[test]
    fn kubernetes_conventions_work() {
        for expr in [
            "object.status.readyInstances == object.spec.instances",
            "has(object.status.readyInstances) && object.status.readyInstances >= 2",
            "object.status.conditions.exists(c, c.type == 'Ready' && c.status == 'True')",
            "object.status.conditions.all(c, c.status == 'True')",
            "object.status.phase.startsWith('Cluster') && object.status.phase.contains('healthy')",
            "object.metadata.labels['app'] == 'pg' && object.status.phase.matches('^Cluster in .*$')",
            "size(object.status.conditions.filter(c, c.status == 'True')) == 1",
            "object.status.phase.lowerAscii().endsWith('state')",
            "!has(object.status.missing)",
        ] {
            let r = run(expr, cnpg(3));
            assert!(r.pass, "{expr}: {r:?}");
        }
        let r = run(
            "object.status.readyInstances == object.spec.instances",
            cnpg(2),
        );
        assert_eq!(r.value, "false");
        assert!(
            r.read.contains("db/main") && r.read.contains("readyInstances"),
            "{r:?}"
        );
    }

    #[test]
    fn only_a_bool_passes_and_errors_are_named() {
        let r = run("object.status.readyInstances", cnpg(3));
        assert!(!r.pass);
        assert!(r.value.contains("gave a int, not a bool"), "{r:?}");
        let r = run("object.status.nope == 1", cnpg(3));
        assert!(!r.pass && r.value.starts_with("error:"), "{r:?}");
        let r = evaluate(&compile("true").unwrap(), &[]);
        assert_eq!(r.value, "no such object");
    }

    #[test]
    fn every_match_must_pass() {
        let p = compile("object.status.readyInstances == object.spec.instances").unwrap();
        let mut other = cnpg(1);
        other["metadata"]["name"] = json!("replica");
        let r = evaluate(&p, &[cnpg(3), other]);
        assert_eq!(r.value, "false for db/replica");
        assert!(evaluate(&p, &[cnpg(3), cnpg(3)]).pass);
    }

    #[test]
    fn hostile_expressions_are_refused_before_they_run() {
        let e = compile(&"(".repeat(200)).unwrap_err();
        assert!(e.message.contains("does not compile"), "{e:?}");
        let nested = "object.a.all(x, object.a.all(y, object.a.all(z, true)))";
        let e = compile(nested).unwrap_err();
        assert!(e.message.contains("3 list macros"), "{e:?}");
        let e = compile(&"1 + ".repeat(2000)).unwrap_err();
        assert!(e.message.contains("at most 4096"), "{e:?}");
        // A list too long to loop over is a failure of the check, not a hang.
        let big =
            json!({"metadata": {"name": "x"}, "spec": {"items": (0..5000).collect::<Vec<_>>()}});
        let r = run(
            "object.spec.items.all(i, object.spec.items.all(j, true))",
            big,
        );
        assert!(!r.pass && r.value.contains("5000 items"), "{r:?}");
    }

    #[test]
    fn a_syntax_error_says_where() {
        let e = compile("object.status ==").unwrap_err();
        assert!(e.message.contains("does not compile"), "{e:?}");
        assert!(e.position.is_some(), "{e:?}");
    }
}
