//! The unified diff a dry-run ApplyConfiguration reports, shaped as upstream's: `--- a`,
//! `+++ b`, then `@@ -start,len +start,len @@` hunks of ` `, `-` and `+` lines with three
//! lines of context (siderolabs/talos v1.13.9 pkg/machinery/textdiff/textdiff.go, a Myers
//! diff with a unified formatter; v1.12.0 and before, hexops/gotextdiff in
//! pkg/machinery/config/configdiff/configdiff.go). The lines chosen may differ from Myers'
//! where several minimal diffs exist; the shape and the changed lines do not.

/// Upstream gives up above this many lines in both texts together.
const MAX_LINES: usize = 75_000;
/// Beyond this many cells the middle is reported as all removed and all added (a larger
/// diff than needed, never a wrong one), so the twin's work stays bounded.
const MAX_CELLS: usize = 4_000_000;
const CONTEXT: usize = 3;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Op {
    Keep,
    Del,
    Add,
}

/// A machine configuration as Talos's encoder writes it for the diff: every document
/// re-encoded (comments disabled, so layout and comments of what was sent do not show),
/// joined by `---`. Text that does not parse (it was validated before) is used as it is.
pub fn encode(raw: &[u8]) -> String {
    let text = String::from_utf8_lossy(raw);
    let mut docs = Vec::new();
    for d in serde_yaml::Deserializer::from_str(&text) {
        match <serde_yaml::Value as serde::Deserialize>::deserialize(d) {
            Ok(v) if v.is_null() => {}
            Ok(v) => match serde_yaml::to_string(&v) {
                Ok(t) => docs.push(t),
                Err(_) => return text.to_string(),
            },
            Err(_) => return text.to_string(),
        }
    }
    docs.join("---\n")
}

/// The unified diff from `a` to `b`; empty when they are equal.
pub fn diff(a: &str, b: &str) -> String {
    if a == b {
        return String::new();
    }
    let (old, new): (Vec<&str>, Vec<&str>) = (a.lines().collect(), b.lines().collect());
    if old.len() + new.len() > MAX_LINES {
        return format!(
            "@@ -1,{} +1,{} @@ diff too large to display\n",
            a.matches('\n').count(),
            b.matches('\n').count()
        );
    }
    let ops = script(&old, &new);
    render(&old, &new, &ops)
}

/// The edit script: common prefix and suffix kept, the middle by longest common subsequence.
fn script(old: &[&str], new: &[&str]) -> Vec<Op> {
    let prefix = old.iter().zip(new).take_while(|(x, y)| x == y).count();
    let suffix = old[prefix..]
        .iter()
        .rev()
        .zip(new[prefix..].iter().rev())
        .take_while(|(x, y)| x == y)
        .count();
    let (o, n) = (
        &old[prefix..old.len() - suffix],
        &new[prefix..new.len() - suffix],
    );
    let mut ops = vec![Op::Keep; prefix];
    if o.len().saturating_mul(n.len()) > MAX_CELLS {
        ops.extend(std::iter::repeat_n(Op::Del, o.len()));
        ops.extend(std::iter::repeat_n(Op::Add, n.len()));
    } else {
        // lcs[i][j]: the longest common subsequence of o[i..] and n[j..].
        let w = n.len() + 1;
        let mut lcs = vec![0u32; (o.len() + 1) * w];
        for i in (0..o.len()).rev() {
            for j in (0..n.len()).rev() {
                lcs[i * w + j] = if o[i] == n[j] {
                    lcs[(i + 1) * w + j + 1] + 1
                } else {
                    lcs[(i + 1) * w + j].max(lcs[i * w + j + 1])
                };
            }
        }
        let (mut i, mut j) = (0, 0);
        while i < o.len() || j < n.len() {
            if i < o.len() && j < n.len() && o[i] == n[j] {
                ops.push(Op::Keep);
                i += 1;
                j += 1;
            } else if j < n.len() && (i == o.len() || lcs[i * w + j + 1] >= lcs[(i + 1) * w + j]) {
                ops.push(Op::Add);
                j += 1;
            } else {
                ops.push(Op::Del);
                i += 1;
            }
        }
        // Upstream prints a change's removals before its additions.
        let mut k = 0;
        while k < ops.len() {
            if ops[k] == Op::Keep {
                k += 1;
                continue;
            }
            let end = ops[k..]
                .iter()
                .position(|op| *op == Op::Keep)
                .map_or(ops.len(), |p| k + p);
            ops[k..end].sort_by_key(|op| *op == Op::Add);
            k = end;
        }
    }
    ops.extend(std::iter::repeat_n(Op::Keep, suffix));
    ops
}

fn render(old: &[&str], new: &[&str], ops: &[Op]) -> String {
    // Each op with the line numbers (0-based) it sits at in old and new.
    let mut at = Vec::with_capacity(ops.len());
    let (mut i, mut j) = (0, 0);
    for op in ops {
        at.push((i, j));
        match op {
            Op::Keep => {
                i += 1;
                j += 1;
            }
            Op::Del => i += 1,
            Op::Add => j += 1,
        }
    }
    let changed: Vec<usize> = (0..ops.len()).filter(|k| ops[*k] != Op::Keep).collect();
    let mut out = String::from("--- a\n+++ b\n");
    let mut k = 0;
    while k < changed.len() {
        let first = changed[k];
        let mut last = first;
        // A hunk takes every change within twice the context of the previous one.
        while k + 1 < changed.len() && changed[k + 1] <= last + 2 * CONTEXT + 1 {
            k += 1;
            last = changed[k];
        }
        k += 1;
        let start = first.saturating_sub(CONTEXT);
        let end = (last + CONTEXT + 1).min(ops.len());
        let span = &ops[start..end];
        let olen = span.iter().filter(|op| **op != Op::Add).count();
        let nlen = span.iter().filter(|op| **op != Op::Del).count();
        let (oi, nj) = at[start];
        out.push_str(&format!(
            "@@ -{},{olen} +{},{nlen} @@\n",
            if olen == 0 { oi } else { oi + 1 },
            if nlen == 0 { nj } else { nj + 1 }
        ));
        for (op, (oi, nj)) in span.iter().zip(&at[start..end]) {
            let (mark, line) = match op {
                Op::Keep => (' ', old[*oi]),
                Op::Del => ('-', old[*oi]),
                Op::Add => ('+', new[*nj]),
            };
            out.push(mark);
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_changed_line_in_context() {
        let a = "a\nb\nc\nd\ne\nf\ng\nh\n";
        let b = "a\nb\nc\nd\nE\nf\ng\nh\n";
        assert_eq!(
            diff(a, b),
            "--- a\n+++ b\n@@ -2,7 +2,7 @@\n b\n c\n d\n-e\n+E\n f\n g\n h\n"
        );
    }

    #[test]
    fn equal_texts_have_no_diff_and_far_changes_make_two_hunks() {
        assert_eq!(diff("x\n", "x\n"), "");
        let a: String = (0..30).map(|i| format!("l{i}\n")).collect();
        let b = a.replace("l2\n", "L2\n").replace("l25\n", "L25\n");
        let d = diff(&a, &b);
        assert_eq!(d.matches("@@ -").count(), 2, "{d}");
        assert!(
            d.contains("-l2\n+L2\n") && d.contains("-l25\n+L25\n"),
            "{d}"
        );
    }

    #[test]
    fn insertions_and_removals() {
        let d = diff("a\nb\n", "a\nx\nb\ny\n");
        assert_eq!(d, "--- a\n+++ b\n@@ -1,2 +1,4 @@\n a\n+x\n b\n+y\n");
        let d = diff("a\nb\nc\n", "a\nc\n");
        assert_eq!(d, "--- a\n+++ b\n@@ -1,3 +1,2 @@\n a\n-b\n c\n");
    }
}
