//! Request ids: JSON-RPC allows a number or a string. Other JSON types are rejected by the
//! decoder with -32600 (see [`crate::message`]).

use serde::{Deserialize, Serialize};
use std::fmt;

/// A JSON-RPC request id.
///
/// Deserialized by hand rather than as an untagged enum: serde buffers an untagged value
/// into its `Content` first, code every message paid for (issue 25). What it accepts is the
/// same: an integer that fits an `i64`, or a string.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(untagged)]
pub enum Id {
    /// An integer id (what almost every client sends).
    Num(i64),
    /// A string id.
    Str(String),
}

impl<'de> Deserialize<'de> for Id {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Id, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = Id;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an integer or a string")
            }
            fn visit_i64<E: serde::de::Error>(self, n: i64) -> Result<Id, E> {
                Ok(Id::Num(n))
            }
            fn visit_u64<E: serde::de::Error>(self, n: u64) -> Result<Id, E> {
                i64::try_from(n)
                    .map(Id::Num)
                    .map_err(|_| E::invalid_value(serde::de::Unexpected::Unsigned(n), &self))
            }
            fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<Id, E> {
                Ok(Id::Str(s.to_owned()))
            }
            fn visit_string<E: serde::de::Error>(self, s: String) -> Result<Id, E> {
                Ok(Id::Str(s))
            }
        }
        d.deserialize_any(V)
    }
}

impl fmt::Display for Id {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Id::Num(n) => write!(f, "{n}"),
            Id::Str(s) => write!(f, "{s:?}"),
        }
    }
}

impl From<i64> for Id {
    fn from(n: i64) -> Self {
        Id::Num(n)
    }
}

impl From<&str> for Id {
    fn from(s: &str) -> Self {
        Id::Str(s.to_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::Id;
    use serde::Deserialize;

    /// What `Id` was before it was deserialized by hand: the hand-written one must agree.
    #[derive(Deserialize, Debug, PartialEq)]
    #[serde(untagged)]
    enum Untagged {
        Num(i64),
        Str(String),
    }

    fn same(json: &str) -> Option<Id> {
        let ours = serde_json::from_str::<Id>(json).ok();
        let old = serde_json::from_str::<Untagged>(json)
            .ok()
            .map(|u| match u {
                Untagged::Num(n) => Id::Num(n),
                Untagged::Str(s) => Id::Str(s),
            });
        assert_eq!(ours, old, "{json}");
        // The same through a Value (ids copied out of parsed params).
        if let Ok(v) = serde_json::from_str::<serde_json::Value>(json) {
            assert_eq!(
                serde_json::from_value::<Id>(v).ok(),
                ours,
                "{json} as a Value"
            );
        }
        ours
    }

    #[test]
    fn ids_are_integers_that_fit_or_strings_as_before() {
        assert_eq!(same("7"), Some(Id::Num(7)));
        assert_eq!(same("-7"), Some(Id::Num(-7)));
        assert_eq!(same("9223372036854775807"), Some(Id::Num(i64::MAX)));
        assert_eq!(same("-9223372036854775808"), Some(Id::Num(i64::MIN)));
        assert_eq!(same("\"a\\\"b\""), Some(Id::Str("a\"b".into())));
        assert_eq!(same("\"7\""), Some(Id::Str("7".into())));
        for bad in [
            // serde_json reads -0 as a float.
            "-0",
            "9223372036854775808",
            "18446744073709551616",
            "1.0",
            "1e3",
            "null",
            "true",
            "[]",
            "{}",
        ] {
            assert_eq!(same(bad), None, "{bad}");
        }
    }
}
