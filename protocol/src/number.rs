//! Integers as JSON Schema reads them, for request fields the OpenAPI document types
//! `integer`: a JSON number with no fractional part is an integer whether written `4390`,
//! `4390.0` or `4.39e3`, so all three are accepted; `4390.5` is refused. Use these with
//! `#[serde(default, deserialize_with = "...")]`; serialising is unchanged (a plain integer).
//!
//! A field read this way names its schema with `#[schemars(with = "Option<Int<T>>")]`:
//! [`Int`]'s schema is an `integer` within `T`'s range, which is exactly what it accepts.

use std::borrow::Cow;
use std::fmt;
use std::marker::PhantomData;

use schemars::{json_schema, JsonSchema, Schema, SchemaGenerator};
use serde::de::{self, Deserializer, SeqAccess, Unexpected, Visitor};
use serde::Deserialize;

/// The integer `v` is, if it is finite with no fractional part.
pub fn integral(v: f64) -> Option<i128> {
    // 2^127 as f64: every integral f64 below it in magnitude converts exactly.
    const LIMIT: f64 = 1.7014118346046923e38;
    (v.is_finite() && v.fract() == 0.0 && v.abs() < LIMIT).then_some(v as i128)
}

struct IntVisitor<T>(PhantomData<T>);

/// The smallest integer taken, whatever the type: serde_json reads an integer literal below
/// -2^63 as the nearest float, which may be -2^63 itself, so -2^63 could stand for a smaller
/// integer and is refused in every spelling.
const MIN: i128 = i64::MIN as i128 + 1;

impl<T: TryFrom<i128>> IntVisitor<T> {
    fn fit<E: de::Error>(v: i128, unexp: Unexpected<'_>) -> Result<T, E> {
        let refuse = || E::invalid_value(unexp, &Self(PhantomData));
        if v < MIN {
            return Err(refuse());
        }
        T::try_from(v).map_err(|_| refuse())
    }
}

impl<T: TryFrom<i128>> Visitor<'_> for IntVisitor<T> {
    type Value = T;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(
            f,
            "an integer of type {}",
            std::any::type_name::<T>()
                .rsplit("::")
                .next()
                .unwrap_or("integer")
        )
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<T, E> {
        Self::fit(v.into(), Unexpected::Signed(v))
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<T, E> {
        Self::fit(v.into(), Unexpected::Unsigned(v))
    }

    fn visit_i128<E: de::Error>(self, v: i128) -> Result<T, E> {
        Self::fit(v, Unexpected::Other("a 128-bit integer"))
    }

    fn visit_u128<E: de::Error>(self, v: u128) -> Result<T, E> {
        let v = i128::try_from(v)
            .map_err(|_| E::invalid_value(Unexpected::Other("a 128-bit integer"), &self))?;
        Self::fit(v, Unexpected::Other("a 128-bit integer"))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<T, E> {
        match integral(v) {
            Some(i) => Self::fit(i, Unexpected::Float(v)),
            None => Err(E::invalid_value(Unexpected::Float(v), &self)),
        }
    }
}

/// A value of integer type `T` that may arrive as an integral float.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Int<T>(pub T);

impl<'de, T: TryFrom<i128>> Deserialize<'de> for Int<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(IntVisitor(PhantomData)).map(Int)
    }
}

/// `Int<T>`'s schema: JSON Schema's `integer` (any number without a fractional part, as the
/// visitor reads it) bounded by `T`'s range (and [`MIN`]), outside which it refuses the value.
macro_rules! int_schema {
    ($($t:ty),*) => {$(
        impl JsonSchema for Int<$t> {
            fn inline_schema() -> bool {
                true
            }

            fn schema_name() -> Cow<'static, str> {
                concat!("Int_", stringify!($t)).into()
            }

            fn json_schema(_: &mut SchemaGenerator) -> Schema {
                // Between MIN and 0, so it always fits.
                let min = i64::try_from(MIN.max(<$t>::MIN.into())).unwrap_or(0);
                json_schema!({"type": "integer", "minimum": min, "maximum": <$t>::MAX})
            }
        }
    )*};
}

int_schema!(i64, u64, u32);

/// The schema of a field that is required yet may be `null` (`#[schemars(with =
/// "Nullable<T>")]`): `T` or `null`. schemars takes a plain `Option` field as optional, and
/// `#[schemars(required)]` drops its `null`.
pub struct Nullable<T>(PhantomData<T>);

impl<T: JsonSchema> JsonSchema for Nullable<T> {
    fn inline_schema() -> bool {
        true
    }

    fn schema_name() -> Cow<'static, str> {
        format!("Nullable_{}", T::schema_name()).into()
    }

    fn schema_id() -> Cow<'static, str> {
        format!("{}::Nullable<{}>", module_path!(), T::schema_id()).into()
    }

    fn json_schema(generator: &mut SchemaGenerator) -> Schema {
        Option::<T>::json_schema(generator)
    }
}

/// An integer field (see the module docs).
pub fn int<'de, D: Deserializer<'de>, T: TryFrom<i128>>(d: D) -> Result<T, D::Error> {
    Int::<T>::deserialize(d).map(|Int(v)| v)
}

/// An optional integer field: absent or `null` is `None`.
pub fn opt_int<'de, D: Deserializer<'de>, T: TryFrom<i128>>(d: D) -> Result<Option<T>, D::Error> {
    Ok(Option::<Int<T>>::deserialize(d)?.map(|Int(v)| v))
}

/// A list of integers.
pub fn int_list<'de, D: Deserializer<'de>, T: TryFrom<i128>>(d: D) -> Result<Vec<T>, D::Error> {
    struct ListVisitor<T>(PhantomData<T>);
    impl<'de, T: TryFrom<i128>> Visitor<'de> for ListVisitor<T> {
        type Value = Vec<T>;
        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("a list of integers")
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<T>, A::Error> {
            let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(4096));
            while let Some(Int(v)) = seq.next_element::<Int<T>>()? {
                out.push(v);
            }
            Ok(out)
        }
    }
    d.deserialize_seq(ListVisitor(PhantomData))
}

/// An optional list of integers: absent or `null` is `None`.
pub fn opt_int_list<'de, D: Deserializer<'de>, T: TryFrom<i128>>(
    d: D,
) -> Result<Option<Vec<T>>, D::Error> {
    #[derive(Deserialize)]
    #[serde(bound = "T: TryFrom<i128>")]
    struct List<T>(#[serde(deserialize_with = "int_list")] Vec<T>);
    Ok(Option::<List<T>>::deserialize(d)?.map(|List(v)| v))
}

/// A list of lists of integers.
pub fn int_lists<'de, D: Deserializer<'de>, T: TryFrom<i128>>(
    d: D,
) -> Result<Vec<Vec<T>>, D::Error> {
    #[derive(Deserialize)]
    #[serde(bound = "T: TryFrom<i128>")]
    struct List<T>(#[serde(deserialize_with = "int_list")] Vec<T>);
    Ok(Vec::<List<T>>::deserialize(d)?
        .into_iter()
        .map(|List(v)| v)
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Deserialize, PartialEq)]
    struct S {
        #[serde(default, deserialize_with = "opt_int")]
        a: Option<i64>,
        #[serde(default, deserialize_with = "opt_int_list")]
        l: Option<Vec<u32>>,
    }

    fn s(json: &str) -> Result<S, serde_json::Error> {
        serde_json::from_str(json)
    }

    #[test]
    fn integral_numbers_in_any_notation_are_integers() {
        for (json, want) in [
            (r#"{"a": 4390}"#, Some(4390)),
            (r#"{"a": 4390.0}"#, Some(4390)),
            (r#"{"a": 4.39e3}"#, Some(4390)),
            (r#"{"a": -1.0}"#, Some(-1)),
            (r#"{"a": -9223372036854775807}"#, Some(i64::MIN + 1)),
            (r#"{"a": null}"#, None),
            (r#"{}"#, None),
        ] {
            assert_eq!(s(json).unwrap().a, want, "{json}");
        }
        assert_eq!(s(r#"{"l": [1, 2.0, 3e0]}"#).unwrap().l, Some(vec![1, 2, 3]));
    }

    #[test]
    fn fractions_and_out_of_range_values_are_refused() {
        for json in [
            r#"{"a": 4390.5}"#,
            r#"{"a": 5e-324}"#,
            r#"{"a": 9223372036854775808}"#,
            r#"{"a": -9223372036854775809}"#,
            r#"{"a": -9223372036854775808}"#,
            r#"{"a": -9.223372036854775808e18}"#,
            r#"{"a": 9.3e18}"#,
            r#"{"a": 1e300}"#,
            r#"{"a": "1"}"#,
            r#"{"a": true}"#,
            r#"{"l": [-1]}"#,
            r#"{"l": [4294967296]}"#,
            r#"{"l": [0.5]}"#,
        ] {
            assert!(s(json).is_err(), "{json}");
        }
    }
}
