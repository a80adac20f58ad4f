//! The members of a routed method's by-name params, still raw and borrowed from the request's
//! own text: the broker reads the few it routes on, drops `provider`, rewrites `sandbox`, and
//! passes every other member on as it came. Params it did not change are passed on as they
//! came, without a copy (issue 25: no map of owned members, no re-serialization per call).
//!
//! A member named twice is read as `serde_json`'s own map reading does (the last one counts),
//! and params with such a member are always written out again with the last one only, so a
//! provider never sees a member the broker read differently.
//!
//! Params have at most [`MAX_MEMBERS`] members (no method takes more than a few dozen): more
//! is E1004 as soon as the limit is passed, so a 60 MB object of one-byte members is never
//! listed. A provider that takes a `serde_json::Value` ([`Members::plan`]) gets one whose
//! cost was counted before it was built, its largest string member made in place from the
//! request's own buffer (issue 42: a `Value` tree costs 10 to 40 times its text).

use crate::outbound::Pool;
use abx_protocol::{message, AbxError, ErrorCode};
use serde::de::{Deserializer, MapAccess, Visitor};
use serde::ser::{SerializeMap, Serializer};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use serde_json::Value;
use std::borrow::Cow;
use std::fmt;
use tokio::sync::OwnedSemaphorePermit;

/// The most members params may have.
pub const MAX_MEMBERS: usize = abx_protocol::api::params::MAX_MEMBERS;
/// A string member at least this long is made in place (the request's buffer becomes it).
const IN_PLACE: usize = 64 * 1024;
/// What a `Value` of params may cost beside its in-place string before it is counted in the
/// budget (less is the request's own: within its headroom or allowance).
const VALUE_SMALL: usize = 64 * 1024;
/// What each member of a `Value` map costs beside its key and value (see
/// `abx_protocol::message::value_cost`).
const MEMBER_COST: usize = 128;

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

/// Why params with too many members were refused.
const TOO_MANY: &str = "params have more than 256 members";

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
            if m.list.len() == MAX_MEMBERS {
                return Err(serde::de::Error::custom(TOO_MANY));
            }
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
            if e.to_string().starts_with(TOO_MANY) {
                return AbxError::invalid_params(method, TOO_MANY);
            }
            // Told apart without a tree of them: valid JSON that is not an object, or not JSON.
            match serde_json::from_str::<serde::de::IgnoredAny>(raw.get()) {
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

    /// The member named `key` (the last one), when it is read from the params' text (not
    /// one the broker inserted): borrowed for as long as that text.
    pub(crate) fn get_borrowed(&self, key: &str) -> Option<&'a RawValue> {
        match self
            .list
            .iter()
            .rev()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v)
        {
            Some(Cow::Borrowed(v)) => Some(*v),
            _ => None,
        }
    }

    /// The members' names, in the order they came (a name given twice: twice).
    pub(crate) fn names(&self) -> impl Iterator<Item = &str> {
        self.list.iter().map(|(k, _)| &**k)
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

/// Params on their way to a provider that takes a `Value` ([`Members::plan`]): every member
/// but the in-place one already a tree (counted), the in-place one still in the request's
/// buffer.
pub(crate) struct Plan {
    map: serde_json::Map<String, Value>,
    /// The member made from the request's buffer: its name, where its text starts and how
    /// long it is.
    in_place: Option<(String, usize, usize)>,
    counted: Option<OwnedSemaphorePermit>,
}

impl<'a> Members<'a> {
    /// What these members (read from `base`, the text they borrow from) become as a
    /// `Value` map, its cost counted first: the largest string member of at least 64 KiB is
    /// left in the request's buffer (made a `String` in place by [`Plan::finish`]), every
    /// other member is costed ([`message::value_cost`]) and built. Beyond 64 KiB the cost is
    /// taken from the budget now (E1013 when it has no room: the request holds budget already
    /// and never waits for more); beyond an eighth of the budget it is E1005.
    pub(crate) fn plan(self, method: &str, base: &str, pool: &Pool) -> Result<Plan, AbxError> {
        let range = |v: &RawValue| {
            let (at, b) = (v.get().as_ptr() as usize, base.as_ptr() as usize);
            (at >= b && at + v.get().len() <= b + base.len()).then(|| (at - b, v.get().len()))
        };
        let members: Vec<(Cow<'a, str>, Cow<'a, RawValue>)> = self.into_unique().collect();
        let in_place = members
            .iter()
            .enumerate()
            .filter(|(_, (_, v))| {
                matches!(v, Cow::Borrowed(_))
                    && v.get().starts_with('"')
                    && v.get().len() >= IN_PLACE
            })
            .max_by_key(|(_, (_, v))| v.get().len())
            .map(|(i, _)| i);
        let mut cost = 0usize;
        for (i, (k, v)) in members.iter().enumerate() {
            if Some(i) == in_place {
                continue;
            }
            let c =
                message::value_cost(v.get()).map_err(|e| AbxError::invalid_params(method, e))?;
            cost = cost.saturating_add(c + MEMBER_COST + k.len());
        }
        let limit = pool.cap() / 8;
        if cost > limit {
            let mut e = AbxError::new(ErrorCode::MessageTooLarge, &[]);
            e.message = format!(
                "Params too large to read: '{method}' would hold {cost} bytes of them as the provider reads them (the limit is {limit})."
            );
            e.suggestion = "Send fewer or smaller values (a long list or map is many small allocations); large data goes as one string (files/write, stdin).".into();
            return Err(e.with_data("limit", limit).with_data("size", cost));
        }
        let counted = if cost > VALUE_SMALL {
            match pool.try_take_exact(cost) {
                Some(p) => Some(p),
                None => {
                    return Err(AbxError::new(
                        ErrorCode::Busy,
                        &[(
                            "detail",
                            &format!(
                                "the memory budget has no room now for the {cost} bytes the params of '{method}' take as the provider reads them; it was not run"
                            ),
                        )],
                    ))
                }
            }
        } else {
            None
        };
        let mut map = serde_json::Map::new();
        let mut place = None;
        for (i, (k, v)) in members.into_iter().enumerate() {
            if Some(i) == in_place {
                if let Some((start, len)) = range(&v) {
                    place = Some((k.into_owned(), start, len));
                    continue;
                }
            }
            let value =
                serde_json::from_str(v.get()).map_err(|e| AbxError::invalid_params(method, e))?;
            map.insert(k.into_owned(), value);
        }
        Ok(Plan {
            map,
            in_place: place,
            counted,
        })
    }
}

impl Plan {
    /// The `Value` the provider gets, made of `owner` (the text the members were read from):
    /// its in-place member a `String` of the owner's own buffer. With it, the budget counted
    /// for the rest of the tree (held until the provider is done with it).
    pub(crate) fn finish(
        self,
        method: &str,
        owner: Option<Box<RawValue>>,
    ) -> Result<(Value, Option<OwnedSemaphorePermit>), AbxError> {
        let Plan {
            mut map,
            in_place,
            counted,
        } = self;
        if let (Some((name, start, len)), Some(owner)) = (in_place, owner) {
            let text: Box<str> = owner.into();
            let s = message::string_in_place(String::from(text).into_bytes(), start, len)
                .ok_or_else(|| {
                    AbxError::invalid_params(method, format!("'{name}' is not a valid string"))
                })?;
            map.insert(name, Value::String(s));
        }
        Ok((Value::Object(map), counted))
    }
}

/// Params a provider reads as a `Value` (`params`: an object), its cost counted first and its
/// largest string made in place (see [`Members::plan`]): the plugin host's own methods
/// (`exec/run` and the others it serves itself) read them so.
pub fn params_value(
    method: &str,
    params: Box<RawValue>,
    pool: &Pool,
) -> Result<(Value, Option<OwnedSemaphorePermit>), AbxError> {
    let plan = Members::parse(method, &params)?.plan(method, params.get(), pool)?;
    plan.finish(method, Some(params))
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

    /// Params read as a tree by a provider: its cost known before it is built (a list of
    /// millions is refused, never built), its large string made of the request's own buffer
    /// (the same text as serde_json reads it), more than 256 members refused as they come.
    #[test]
    fn params_as_a_tree_are_counted_before_they_are_built() {
        let pool = Pool::new(128 << 20);
        let data = format!("{}\\n\\u00e9\\\"", "x".repeat(IN_PLACE));
        let text = format!(r#"{{"sandbox":"s","data":"{data}","env":{{"A":"1"}}}}"#);
        let (v, counted) = params_value("files/write", raw(&text), &pool).unwrap();
        assert_eq!(v, serde_json::from_str::<Value>(&text).unwrap());
        assert!(counted.is_none(), "the rest of the tree is small");
        // A list of a million zeros would take ~64 MB as a tree: refused unbuilt.
        let text = format!(r#"{{"metadata":{{"x":[{}0]}}}}"#, "0,".repeat(1_000_000));
        let e = params_value("sandbox/create", raw(&text), &pool).unwrap_err();
        assert_eq!(e.code, ErrorCode::MessageTooLarge, "{}", e.message);
        // A smaller one is counted in the budget while the provider holds it.
        let text = format!(r#"{{"metadata":{{"x":[{}0]}}}}"#, "0,".repeat(10_000));
        let (_, counted) = params_value("sandbox/create", raw(&text), &pool).unwrap();
        assert!(counted.expect("counted").num_permits() > 10_000 * 32);
        // Too many members: refused as soon as the limit is passed.
        let text = format!("{{{}\"z\":0}}", r#""a":0,"#.repeat(MAX_MEMBERS));
        let e = Members::parse("m", &raw(&text)).err().unwrap();
        assert!(e.message.contains("more than 256 members"), "{}", e.message);
    }
}
