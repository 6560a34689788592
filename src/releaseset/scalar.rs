//! Deserialize a YAML scalar into a type parsed from its text, raising the parse error
//! inside the visitor so serde_yaml reports the scalar's own line and column.

use std::fmt;
use std::marker::PhantomData;

use serde::de::{self, Deserializer, Visitor};

/// What a scalar type parses from, and what to say when given a non-string.
pub trait FromScalar: Sized {
    /// e.g. "a version like v1.36.2".
    const EXPECTING: &'static str;
    fn from_text(text: &str) -> Result<Self, String>;
    /// A bare YAML number (`1.30`). By default it is parsed from its printed form.
    fn from_number(printed: &str) -> Result<Self, String> {
        Self::from_text(printed)
    }
}

struct ScalarVisitor<T>(PhantomData<T>);

impl<T: FromScalar> Visitor<'_> for ScalarVisitor<T> {
    type Value = T;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str(T::EXPECTING)
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<T, E> {
        T::from_text(v).map_err(E::custom)
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<T, E> {
        T::from_number(&v.to_string()).map_err(E::custom)
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<T, E> {
        T::from_number(&v.to_string()).map_err(E::custom)
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<T, E> {
        T::from_number(&v.to_string()).map_err(E::custom)
    }
}

pub fn deserialize<'de, D: Deserializer<'de>, T: FromScalar>(d: D) -> Result<T, D::Error> {
    d.deserialize_any(ScalarVisitor(PhantomData))
}
