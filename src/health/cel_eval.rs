//! CEL over Kubernetes objects, the way Kubernetes writes it (ValidatingAdmissionPolicy,
//! CRD validation rules): the object as `object`, `has()`, the string functions and the
//! list macros (`all`, `exists`, `exists_one`/`existsOne`, `map`, `filter`), through the
//! `cel` crate.
//!
//! A PR is hostile input, and the `cel` crate has no cost model and cannot stop an
//! evaluation, so an expression is bounded before it runs, on its parsed form (not its
//! text, which spacing and aliases slip past): its source size, its nesting (the parser's
//! own recursion limit), how many loops it nests and how many steps they multiply to, and
//! how many bytes its string and list functions can allocate. What it reads is bounded at
//! run time: lists and strings in the object. The rollout's adapter also runs it on a
//! blocking thread with a time budget, so a case these bounds miss cannot hold the engine.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

use cel::common::ast::{EntryExpr, Expr, IdedExpr, LiteralValue};
use cel::objects::Key;
use cel::{Context, Env, Program, Value};

use super::Reading;
use crate::releaseset::excerpt;

/// The longest expression accepted.
pub const MAX_EXPRESSION_BYTES: usize = 4096;
/// Loops (list macros) one expression may use: two nested loops over lists of at most
/// [`MAX_LIST_ITEMS`] is a million steps; a third would be a billion.
pub const MAX_COMPREHENSIONS: usize = 2;
/// The longest list in an object an expression may see; a longer one fails the check
/// (no Kubernetes status a health check reads is that long).
pub const MAX_LIST_ITEMS: usize = 1000;
/// The longest string in an object an expression may see; a longer one fails the check.
/// It bounds what `split`, `replace` and `+` can make of a string the object holds.
pub const MAX_STRING_BYTES: u64 = 16 * 1024;
/// The most steps the estimate of one evaluation may reach (each node, times the loops
/// around it); Kubernetes' per-expression limit is of the same order.
pub const MAX_COST: u64 = 10_000_000;
/// The most bytes one string or list an expression builds may hold, and the most a loop
/// may keep (`map`, `filter`): what is built and dropped each iteration is not summed.
pub const MAX_ALLOC_BYTES: u64 = 64 * 1024 * 1024;

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
    let program = env().compile(source).map_err(|e| {
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
    })?;
    let mut est = Estimate::default();
    est.walk(program.expression(), 1, 0).map_err(plain)?;
    Ok(program)
}

/// What evaluating an expression can cost at most, estimated on its parsed form.
#[derive(Debug, Default)]
struct Estimate {
    /// Steps: each node once per iteration of the loops around it.
    steps: u64,
    loops: usize,
}

/// The functions that allocate a new string or list from their arguments.
const ALLOCATING: [&str; 14] = [
    "_+_",
    "replace",
    "split",
    "join",
    "format",
    "strings.quote",
    "quote",
    "reverse",
    "lowerAscii",
    "upperAscii",
    "trim",
    "substring",
    "charAt",
    "string",
];

fn literal_len(e: &IdedExpr) -> Option<u64> {
    match &e.expr {
        Expr::Literal(LiteralValue::String(s)) => Some(s.inner().len() as u64),
        _ => None,
    }
}

impl Estimate {
    /// Walk `e`, run `times` times (the product of the loops around it) inside `depth`
    /// loops; the answer is the most bytes a string or list `e` gives can hold.
    fn walk(&mut self, e: &IdedExpr, times: u64, depth: usize) -> Result<u64, String> {
        self.steps = self.steps.saturating_add(times);
        if self.steps > MAX_COST {
            return Err(format!(
                "the expression may take more than {MAX_COST} steps (loops multiply what they contain); loop over fewer lists or do less inside them"
            ));
        }
        let size = match &e.expr {
            Expr::Literal(LiteralValue::String(s)) => s.inner().len() as u64,
            Expr::Literal(LiteralValue::Bytes(b)) => b.len() as u64,
            Expr::Literal(_) | Expr::Unspecified => 8,
            // What the object holds, bounded when it is read (`to_cel`).
            Expr::Ident(_) => MAX_STRING_BYTES,
            Expr::Select(sel) => {
                self.walk(&sel.operand, times, depth)?;
                MAX_STRING_BYTES
            }
            Expr::List(l) => {
                let mut sum = 0u64;
                for x in &l.elements {
                    sum = sum.saturating_add(self.walk(x, times, depth)?);
                }
                sum
            }
            Expr::Map(m) => {
                let mut sum = 0u64;
                for entry in &m.entries {
                    if let EntryExpr::MapEntry(me) = &entry.expr {
                        sum = sum.saturating_add(self.walk(&me.key, times, depth)?);
                        sum = sum.saturating_add(self.walk(&me.value, times, depth)?);
                    }
                }
                sum
            }
            Expr::Struct(st) => {
                let mut sum = 0u64;
                for entry in &st.entries {
                    if let EntryExpr::StructField(f) = &entry.expr {
                        sum = sum.saturating_add(self.walk(&f.value, times, depth)?);
                    }
                }
                sum
            }
            Expr::Comprehension(c) => {
                self.loops += 1;
                if self.loops > MAX_COMPREHENSIONS || depth + 1 > MAX_COMPREHENSIONS {
                    return Err(format!(
                        "the expression uses more than {MAX_COMPREHENSIONS} list macros (all, exists, exists_one/existsOne, map, filter); at most {MAX_COMPREHENSIONS} are allowed, so it stays cheap to evaluate"
                    ));
                }
                let range = self.walk(&c.iter_range, times, depth)?;
                // A list in the object has at most MAX_LIST_ITEMS items; one made here
                // (a literal, `split`) at most one per byte it was made from.
                let items = match &c.iter_range.expr {
                    Expr::List(l) => l.elements.len() as u64,
                    Expr::Ident(_) | Expr::Select(_) => MAX_LIST_ITEMS as u64,
                    _ => range.max(MAX_LIST_ITEMS as u64),
                };
                let inner = times.saturating_mul(items.max(1));
                self.walk(&c.accu_init, times, depth)?;
                self.walk(&c.loop_cond, inner, depth + 1)?;
                let step = self.walk(&c.loop_step, inner, depth + 1)?;
                self.walk(&c.result, times, depth)?;
                // `map` and `filter` keep what each step gives.
                let kept = step.saturating_mul(items.max(1));
                if kept > MAX_ALLOC_BYTES {
                    return Err(format!(
                        "a loop of the expression may keep more than {} MiB (what each step builds, times the items); build less in it",
                        MAX_ALLOC_BYTES >> 20
                    ));
                }
                kept
            }
            Expr::Call(call) => {
                let target = match &call.target {
                    Some(t) => Some(self.walk(t, times, depth)?),
                    None => None,
                };
                let mut args = Vec::with_capacity(call.args.len());
                for a in &call.args {
                    args.push(self.walk(a, times, depth)?);
                }
                let biggest = target
                    .into_iter()
                    .chain(args.iter().copied())
                    .max()
                    .unwrap_or(8);
                let name = call.func_name.as_str();
                let size = match name {
                    "_+_" => args.iter().sum(),
                    // Each match of `old` becomes `new`; `old` empty matches between every byte.
                    "replace" => {
                        let t = target.unwrap_or(biggest);
                        match (call.args.first().and_then(literal_len), args.get(1)) {
                            (Some(0), Some(new)) => {
                                t.saturating_add(1).saturating_mul(new.saturating_add(1))
                            }
                            (Some(old), Some(new)) => t.saturating_mul(new.div_ceil(old).max(1)),
                            (None, Some(new)) => t.saturating_mul(new.saturating_add(1)),
                            _ => t,
                        }
                    }
                    // As many pieces as bytes, each a string of its own.
                    "split" => target.unwrap_or(biggest).saturating_mul(32),
                    "join" => {
                        let t = target.unwrap_or(biggest);
                        t.saturating_mul(args.first().copied().unwrap_or(0).saturating_add(1))
                    }
                    "format" | "strings.quote" | "quote" => biggest.saturating_mul(2),
                    _ if ALLOCATING.contains(&name) => biggest,
                    // Comparisons, `size`, `contains`, `matches`, logic: a scalar.
                    _ => 8,
                };
                if ALLOCATING.contains(&name) && size > MAX_ALLOC_BYTES {
                    return Err(format!(
                        "the expression's `{}` may build more than {} MiB; build less",
                        name.trim_matches('_'),
                        MAX_ALLOC_BYTES >> 20
                    ));
                }
                size
            }
        };
        Ok(size)
    }
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
        J::String(s) => {
            if s.len() as u64 > MAX_STRING_BYTES {
                return Err(format!(
                    "{} is a string of {} bytes; a check reads strings of at most {MAX_STRING_BYTES}",
                    if path.is_empty() { "object" } else { path },
                    s.len()
                ));
            }
            Value::String(Arc::new(s.clone()))
        }
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

/// `o` without what the API server and kubectl keep for themselves (`managedFields`, the
/// last applied configuration): large, and never what a health check asks about.
fn without_bookkeeping(o: &serde_json::Value) -> serde_json::Value {
    let mut o = o.clone();
    if let Some(m) = o.get_mut("metadata").and_then(|m| m.as_object_mut()) {
        m.remove("managedFields");
        if let Some(a) = m.get_mut("annotations").and_then(|a| a.as_object_mut()) {
            a.remove("kubectl.kubernetes.io/last-applied-configuration");
        }
    }
    o
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
        let value = match to_cel(&without_bookkeeping(o), &mut String::new()) {
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

/// Judge a `failureExpression` over the same objects: `Failed` when it is true for any of
/// them, `Unknown` when it cannot be judged (an error, a value that is not a bool: a check
/// that cannot tell whether it is broken is not a pass), `None` when it is false for all.
pub fn evaluate_failure(program: &Program, objects: &[serde_json::Value]) -> Option<Reading> {
    let env = env();
    for o in objects {
        let name = object_name(o);
        let value = match to_cel(&without_bookkeeping(o), &mut String::new()) {
            Ok(v) => v,
            Err(why) => return Some(Reading::fail(format!("error: {why}"), name)),
        };
        let mut ctx = Context::with_env(env.clone());
        ctx.add_variable_from_value("object", value);
        match program.execute(&ctx) {
            Ok(Value::Bool(false)) => {}
            Ok(Value::Bool(true)) => {
                return Some(Reading::failed(
                    format!("failureExpression is true for {name}"),
                    name,
                ))
            }
            Ok(other) => {
                return Some(Reading::unknown(
                    format!(
                        "error: the failureExpression gave a {}, not a bool",
                        type_name(&other)
                    ),
                    name,
                ))
            }
            Err(e) => {
                return Some(Reading::unknown(
                    format!("error: failureExpression: {}", excerpt(&e.to_string(), 200)),
                    name,
                ))
            }
        }
    }
    None
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
            assert!(r.passes(), "{expr}: {r:?}");
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
        assert!(!r.passes());
        assert!(r.value.contains("gave a int, not a bool"), "{r:?}");
        let r = run("object.status.nope == 1", cnpg(3));
        assert!(!r.passes() && r.value.starts_with("error:"), "{r:?}");
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
        assert!(evaluate(&p, &[cnpg(3), cnpg(3)]).passes());
    }

    #[test]
    fn hostile_expressions_are_refused_before_they_run() {
        let e = compile(&"(".repeat(200)).unwrap_err();
        assert!(e.message.contains("does not compile"), "{e:?}");
        let nested = "object.a.all(x, object.a.all(y, object.a.all(z, true)))";
        let e = compile(nested).unwrap_err();
        assert!(e.message.contains("more than 2 list macros"), "{e:?}");
        let e = compile(&"1 + ".repeat(2000)).unwrap_err();
        assert!(e.message.contains("at most 4096"), "{e:?}");
        // A list too long to loop over is a failure of the check, not a hang.
        let big =
            json!({"metadata": {"name": "x"}, "spec": {"items": (0..5000).collect::<Vec<_>>()}});
        let r = run(
            "object.spec.items.all(i, object.spec.items.all(j, true))",
            big,
        );
        assert!(!r.passes() && r.value.contains("5000 items"), "{r:?}");
    }

    /// Issue 46 item 2: each bypass of the old textual bound is refused on the parsed form.
    #[test]
    fn the_bypasses_of_a_textual_bound_are_refused_on_the_parsed_form() {
        for (expr, says) in [
            // `existsOne`, the cel-go alias, is a loop too.
            (
                "object.a.existsOne(x, object.a.existsOne(y, object.a.existsOne(z, true)))",
                "more than 2 list macros",
            ),
            // Spacing before `(` hid a macro from the text count.
            (
                "object.a.all (x, object.a.all (y, object.a.all (z, true)))",
                "more than 2 list macros",
            ),
            // `split('')` makes a list as long as the string: two loops over it are billions of steps.
            (
                "object.s.split('').all(c, object.s.split('').all(d, c == d))",
                "steps",
            ),
            // Two loops over lists the object holds, with much inside, are too many steps.
            (
                "object.a.all(x, object.a.all(y, x.a == y.a && x.b == y.b && x.c == y.c && x.d == y.d))",
                "steps",
            ),
            // Chained `replace` multiplies a string's length until memory runs out.
            (
                &format!(
                    "'a'{}.size() > 0",
                    ".replace('a', 'aaaaaaaaaaaaaaaa')".repeat(12)
                ),
                "may build more than 64 MiB",
            ),
            (
                "object.s.replace('', object.s).size() > 0",
                "may build more than 64 MiB",
            ),
            // Concatenation inside a loop keeps every result.
            (
                "object.a.map(x, object.s + object.s + object.s + object.s + object.s).size() > 0",
                "may keep more than 64 MiB",
            ),
        ] {
            let e = compile(expr)
                .err()
                .unwrap_or_else(|| panic!("{expr} compiled"));
            assert!(e.message.contains(says), "{expr}: {e:?}");
        }
        // What checks write stays accepted, two loops included.
        for expr in [
            "object.a.all(x, object.a.exists(y, x == y))",
            "object.s.replace('-', '_').split(',').exists(p, p == 'ok')",
            "object.a.map(x, x.name + '/' + x.namespace).size() > 0",
        ] {
            assert!(compile(expr).is_ok(), "{expr}: {:?}", compile(expr).err());
        }
        // A string too long to read is a failure of the check, naming where it is.
        let big = json!({"metadata": {"name": "x", "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "a".repeat(20_000)}}, "data": {"blob": "a".repeat(20_000)}});
        assert!(run("object.metadata.name == 'x'", without_blob(&big)).passes());
        let r = run("object.data.blob.size() > 0", big);
        assert!(
            !r.passes() && r.value.contains(".data.blob is a string of 20000 bytes"),
            "{r:?}"
        );
    }

    fn without_blob(o: &serde_json::Value) -> serde_json::Value {
        let mut o = o.clone();
        o["data"] = json!({});
        o
    }

    #[test]
    fn a_syntax_error_says_where() {
        let e = compile("object.status ==").unwrap_err();
        assert!(e.message.contains("does not compile"), "{e:?}");
        assert!(e.position.is_some(), "{e:?}");
    }
}
