//! The members of a routed method's by-name params, still raw and borrowed from the request's
//! own text: the broker reads the few it routes on, drops `provider`, rewrites `sandbox`, and
//! passes every other member on as it came. Params it did not change are passed on as they
//! came, without a copy (issue 25: no map of owned members, no re-serialization per call).
//!
//! A member named twice is read as `serde_json`'s own map reading does (the last one counts),
//! and params with such a member are always written out again with the last one only, so a
//! provider never sees a member the broker read differently.

use abx_protocol::AbxError;
use serde::de::{Deserializer, MapAccess, Visitor};
use serde::ser::{SerializeMap, Serializer};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use serde_json::Value;
use std::borrow::Cow;
use std::fmt;

/// A params object's members, in the order they came.
#[derive(Default)]
pub(crate) struct Members<'a> {
    list: Vec<(Cow<'a, str>, Cow<'a, RawValue>)>,
    /// Whether what [`Members::to_raw`] writes differs from the text they were read from: a
    /// member removed, inserted, or named twice.
    changed: bool,
}

/// A member's name: borrowed when it has no escapes.
struct Key<'a>(Cow<'a, str>);

impl<'de> Deserialize<'de> for Key<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_str(StrVisitor).map(Key)
    }
}

/// Reads a JSON string, borrowed from the input when it can be.
struct StrVisitor;

impl<'de> Visitor<'de> for StrVisitor {
    type Value = Cow<'de, str>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a string")
    }
    fn visit_borrowed_str<E>(self, s: &'de str) -> Result<Self::Value, E> {
        Ok(Cow::Borrowed(s))
    }
    fn visit_str<E>(self, s: &str) -> Result<Self::Value, E> {
        Ok(Cow::Owned(s.to_owned()))
    }
    fn visit_string<E>(self, s: String) -> Result<Self::Value, E> {
        Ok(Cow::Owned(s))
    }
}

/// Reads an object into [`Members`].
struct MembersVisitor;

impl<'de> Visitor<'de> for MembersVisitor {
    type Value = Members<'de>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an object")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut m = Members {
            list: Vec::with_capacity(map.size_hint().unwrap_or(4)),
            changed: false,
        };
        while let Some(Key(k)) = map.next_key()? {
            let v: &'de RawValue = map.next_value()?;
            m.changed |= m.list.iter().any(|(name, _)| *name == k);
            m.list.push((k, Cow::Borrowed(v)));
        }
        Ok(m)
    }
}

impl<'a> Members<'a> {
    /// The members of by-name params: an object, else E1004 (the JSON error, or "params must
    /// be an object").
    pub(crate) fn parse(method: &str, raw: &'a RawValue) -> Result<Members<'a>, AbxError> {
        let mut de = serde_json::Deserializer::from_str(raw.get());
        de.deserialize_map(MembersVisitor).map_err(|e| {
            match serde_json::from_str::<Value>(raw.get()) {
                Ok(_) => AbxError::invalid_params(method, "params must be an object"),
                Err(_) => AbxError::invalid_params(method, e),
            }
        })
    }

    /// The member named `key` (the last one, if named twice).
    pub(crate) fn get(&self, key: &str) -> Option<&RawValue> {
        self.list
            .iter()
            .rev()
            .find(|(k, _)| k == key)
            .map(|(_, v)| &**v)
    }

    pub(crate) fn contains_key(&self, key: &str) -> bool {
        self.list.iter().any(|(k, _)| k == key)
    }

    /// Take every member named `key` out; the last one is returned.
    pub(crate) fn remove(&mut self, key: &str) -> Option<Cow<'a, RawValue>> {
        let mut found = None;
        let mut i = 0;
        while i < self.list.len() {
            if self.list[i].0 == key {
                found = Some(self.list.remove(i).1);
                self.changed = true;
            } else {
                i += 1;
            }
        }
        found
    }

    /// Set `key` to `value`, in place of any member of that name.
    pub(crate) fn insert(&mut self, key: &'static str, value: Box<RawValue>) {
        self.remove(key);
        self.list.push((Cow::Borrowed(key), Cow::Owned(value)));
        self.changed = true;
    }

    /// Whether [`Members::to_raw`] would write anything other than the text they came from.
    pub(crate) fn changed(&self) -> bool {
        self.changed
    }

    /// The members as one params object (a member named twice: the last one only).
    pub(crate) fn to_raw(&self) -> Result<Box<RawValue>, serde_json::Error> {
        serde_json::value::to_raw_value(self)
    }

    /// The members one at a time, each once (the last of a name), in the order they came.
    pub(crate) fn into_unique(self) -> impl Iterator<Item = (Cow<'a, str>, Cow<'a, RawValue>)> {
        let list = self.list;
        let last: Vec<bool> = (0..list.len())
            .map(|i| !list[i + 1..].iter().any(|(k, _)| *k == list[i].0))
            .collect();
        list.into_iter()
            .zip(last)
            .filter_map(|(m, last)| last.then_some(m))
    }
}

impl Serialize for Members<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(None)?;
        for (i, (k, v)) in self.list.iter().enumerate() {
            if self.list[i + 1..].iter().any(|(later, _)| later == k) {
                continue;
            }
            map.serialize_entry(k, &**v)?;
        }
        map.end()
    }
}

/// A member that must be a string: `Some` of it, `None` for `null`, `Err` for anything else.
pub(crate) fn string_or_null(raw: &RawValue) -> Result<Option<Cow<'_, str>>, ()> {
    if raw.get().trim() == "null" {
        return Ok(None);
    }
    let mut de = serde_json::Deserializer::from_str(raw.get());
    de.deserialize_str(StrVisitor).map(Some).map_err(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn raw(text: &str) -> Box<RawValue> {
        RawValue::from_string(text.to_owned()).unwrap()
    }

    /// What the owned map the broker read params into before made of them (the reference).
    fn by_map(text: &str) -> BTreeMap<String, Value> {
        serde_json::from_str(text).unwrap()
    }

    #[test]
    fn members_read_and_write_as_the_owned_map_did() {
        for text in [
            r#"{}"#,
            r#"{"provider":"echo"}"#,
            r#"{"sandbox":"a","cmd":["sh","-c","x"],"env":{"A":"1"}}"#,
            r#" { "b" : 1 , "a" : [ 1 , 2 ] } "#,
            r#"{"a":1,"a":2}"#,
            r#"{"a":1,"b":2,"a":{"x":3}}"#,
            r#"{"s\u0061ndbox":"x","tab\tkey":"y","quote\"":1}"#,
            r#"{"n":1.5e300,"m":-0,"o":null}"#,
        ] {
            let outer = raw(text);
            let m = Members::parse("m", &outer).unwrap();
            let written: Value = serde_json::from_str(m.to_raw().unwrap().get()).unwrap();
            let want = by_map(text);
            assert_eq!(written, serde_json::to_value(&want).unwrap(), "{text}");
            for (k, v) in &want {
                let got: Value = serde_json::from_str(m.get(k).unwrap().get()).unwrap();
                assert_eq!(&got, v, "{text}: {k}");
                assert!(m.contains_key(k));
            }
            let unique: BTreeMap<String, Value> = m
                .into_unique()
                .map(|(k, v)| (k.into_owned(), serde_json::from_str(v.get()).unwrap()))
                .collect();
            assert_eq!(unique, want, "{text}");
        }
    }

    #[test]
    fn params_are_unchanged_until_a_member_is_removed_inserted_or_named_twice() {
        let text = r#"{"cmd":"true","cwd":"/w"}"#;
        let outer = raw(text);
        let mut m = Members::parse("m", &outer).unwrap();
        assert!(!m.changed());
        assert!(m.remove("provider").is_none());
        assert!(!m.changed(), "removing what is not there changes nothing");
        assert_eq!(m.remove("cwd").unwrap().get(), r#""/w""#);
        assert!(m.changed());
        assert_eq!(m.to_raw().unwrap().get(), r#"{"cmd":"true"}"#);

        let outer = raw(r#"{"sandbox":"abc","x":1}"#);
        let mut m = Members::parse("m", &outer).unwrap();
        m.insert("sandbox", raw(r#""local-id""#));
        assert!(m.changed());
        assert_eq!(m.get("sandbox").unwrap().get(), r#""local-id""#);
        assert_eq!(m.to_raw().unwrap().get(), r#"{"x":1,"sandbox":"local-id"}"#);

        // Named twice: the last one counts, and the params are written out with it alone,
        // so the provider cannot read the first one the broker did not.
        let outer = raw(r#"{"length":1,"length":99999999999}"#);
        let m = Members::parse("m", &outer).unwrap();
        assert!(m.changed());
        assert_eq!(m.get("length").unwrap().get(), "99999999999");
        assert_eq!(m.to_raw().unwrap().get(), r#"{"length":99999999999}"#);

        let mut m = Members::parse("m", &outer).unwrap();
        assert_eq!(m.remove("length").unwrap().get(), "99999999999");
        assert!(
            !m.contains_key("length"),
            "every member of the name is removed"
        );
    }

    #[test]
    fn params_that_are_not_an_object_are_e1004() {
        for (text, says) in [
            ("[1,2]", "params must be an object"),
            ("\"x\"", "params must be an object"),
            ("3", "params must be an object"),
            ("null", "params must be an object"),
        ] {
            let outer = raw(text);
            let e = Members::parse("sandbox/list", &outer).err().unwrap();
            assert_eq!(e.code, abx_protocol::ErrorCode::InvalidParams, "{text}");
            assert!(e.message.contains(says), "{text}: {}", e.message);
        }
    }

    #[test]
    fn string_members_are_read_without_a_value() {
        assert_eq!(string_or_null(&raw(r#""echo""#)), Ok(Some("echo".into())));
        assert_eq!(
            string_or_null(&raw(r#""e\u0063ho""#)),
            Ok(Some("echo".into()))
        );
        assert_eq!(string_or_null(&raw("null")), Ok(None));
        for bad in ["1", "true", "[]", "{}", r#"["echo"]"#] {
            assert_eq!(string_or_null(&raw(bad)), Err(()), "{bad}");
        }
    }
}
