//! YAML from peers and files, bounded. serde_yaml expands aliases while deserializing: a
//! 20 KB "billion laughs" document (each anchor a list of nine aliases of the one before)
//! becomes gigabytes of values. Its own repetition limit (100 alias jumps per event) still
//! lets a small document multiply many thousand times.
//!
//! [`check`] walks the document the way deserialization would, aliases replayed, counting
//! nodes and scalar bytes without keeping any of them, and stops as soon as either passes
//! a budget proportional to the input. Only then does the caller deserialize for real, so
//! what it builds is bounded by a small multiple of what it was sent.

use std::cell::Cell;
use std::fmt;

use serde::de::{
    self, DeserializeSeed, Deserializer, EnumAccess, MapAccess, SeqAccess, VariantAccess, Visitor,
};

/// What a document may expand to: nodes and scalar bytes up to twice its length, plus
/// some slack so short documents may use a few aliases freely.
pub const EXPANSION_FACTOR: usize = 2;
pub const EXPANSION_SLACK: usize = 64 * 1024;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum YamlError {
    #[error("the YAML document expands (through aliases) to more than {limit} nodes or bytes, over {EXPANSION_FACTOR}x its {len}-byte size; refusing it")]
    TooLarge { len: usize, limit: usize },
    #[error("{0}")]
    Syntax(String),
}

/// Checks every document in `text` against the expansion budget. Syntax errors are
/// reported too (deserializing would report the same ones).
pub fn check(text: &str) -> Result<(), YamlError> {
    let limit = text
        .len()
        .saturating_mul(EXPANSION_FACTOR)
        .saturating_add(EXPANSION_SLACK);
    let budget = Budget {
        nodes: Cell::new(limit),
        bytes: Cell::new(limit),
        exceeded: Cell::new(false),
    };
    for doc in serde_yaml::Deserializer::from_str(text) {
        if let Err(e) = Counter(&budget).deserialize(doc) {
            if budget.exceeded.get() {
                return Err(YamlError::TooLarge {
                    len: text.len(),
                    limit,
                });
            }
            return Err(YamlError::Syntax(e.to_string()));
        }
    }
    Ok(())
}

/// Like `serde_yaml::from_str`, after [`check`].
pub fn from_str<T: serde::de::DeserializeOwned>(text: &str) -> Result<T, YamlError> {
    check(text)?;
    serde_yaml::from_str(text).map_err(|e| YamlError::Syntax(e.to_string()))
}

/// Like `serde_yaml::from_slice`, after [`check`] (the bytes must be UTF-8).
pub fn from_slice<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Result<T, YamlError> {
    let text = std::str::from_utf8(bytes).map_err(|e| YamlError::Syntax(e.to_string()))?;
    from_str(text)
}

struct Budget {
    nodes: Cell<usize>,
    bytes: Cell<usize>,
    exceeded: Cell<bool>,
}

impl Budget {
    fn spend<E: de::Error>(&self, bytes: usize) -> Result<(), E> {
        let nodes = self.nodes.get().checked_sub(1);
        let left = self.bytes.get().checked_sub(bytes);
        match (nodes, left) {
            (Some(n), Some(b)) => {
                self.nodes.set(n);
                self.bytes.set(b);
                Ok(())
            }
            _ => {
                self.exceeded.set(true);
                Err(E::custom("expansion budget exceeded"))
            }
        }
    }
}

/// Deserializes anything, keeping nothing, charging the budget for every node.
#[derive(Clone, Copy)]
struct Counter<'a>(&'a Budget);

impl<'de> DeserializeSeed<'de> for Counter<'_> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Counter<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any YAML value")
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<(), E> {
        self.0.spend(1)
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<(), E> {
        self.0.spend(8)
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<(), E> {
        self.0.spend(8)
    }
    fn visit_i128<E: de::Error>(self, _: i128) -> Result<(), E> {
        self.0.spend(16)
    }
    fn visit_u128<E: de::Error>(self, _: u128) -> Result<(), E> {
        self.0.spend(16)
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<(), E> {
        self.0.spend(8)
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<(), E> {
        self.0.spend(v.len())
    }
    fn visit_bytes<E: de::Error>(self, v: &[u8]) -> Result<(), E> {
        self.0.spend(v.len())
    }
    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        self.0.spend(1)
    }
    fn visit_none<E: de::Error>(self) -> Result<(), E> {
        self.0.spend(1)
    }
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
    fn visit_newtype_struct<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        self.0.spend(1)?;
        while seq.next_element_seed(self)?.is_some() {}
        Ok(())
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        self.0.spend(1)?;
        while map.next_key_seed(self)?.is_some() {
            map.next_value_seed(self)?;
        }
        Ok(())
    }
    /// A tagged node (`!tag value`): serde_yaml presents it as an enum.
    fn visit_enum<A: EnumAccess<'de>>(self, data: A) -> Result<(), A::Error> {
        let ((), variant) = data.variant_seed(self)?;
        variant.newtype_variant_seed(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Nine levels of nine aliases each: 9^9 (387 million) leaves from under 1 KB.
    fn billion_laughs() -> String {
        let mut s = String::from(
            "a0: &a0 [\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\"]\n",
        );
        for i in 1..10 {
            let p = i - 1;
            s.push_str(&format!(
                "a{i}: &a{i} [*a{p},*a{p},*a{p},*a{p},*a{p},*a{p},*a{p},*a{p},*a{p}]\n"
            ));
        }
        s
    }

    #[test]
    fn a_billion_laughs_is_refused_quickly() {
        let bomb = billion_laughs();
        assert!(matches!(check(&bomb), Err(YamlError::TooLarge { .. })));
        assert!(matches!(
            from_str::<serde_yaml::Value>(&bomb),
            Err(YamlError::TooLarge { .. })
        ));
    }

    #[test]
    fn ordinary_documents_and_a_few_aliases_pass() {
        let doc = "base: &b {image: x, replicas: 3}\na: *b\nb: *b\n---\nkind: Other\n";
        assert_eq!(check(doc), Ok(()));
        let v: serde_yaml::Value =
            from_str("x: !tag {a: 1}\ny: [1, 2.5, true, null, ~]").unwrap_or_default();
        assert!(v.get("y").is_some());
        assert!(matches!(check("a: [1, 2"), Err(YamlError::Syntax(_))));
    }
}
