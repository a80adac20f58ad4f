//! Which members each method's params take: what the broker checks requests against before
//! it serves or routes them (issue 41), so a member it does not know is
//! refused (E1004 naming it) instead of silently dropped: `sandbox/create {volumes: [...]}`
//! from a client of a newer API must not make a sandbox without its mount.
//!
//! The member names come from the params types themselves: serde's own list of the names a
//! type's `Deserialize` reads (renamed as on the wire, aliases included), so a field added
//! to a type is accepted at once and nothing here lists names twice. A type with a
//! `#[serde(flatten)]` member reads any member (serde keeps no list for it): such a method's
//! params are open.
//!
//! Each method's params type, and whether its params are open, is its entry in the one
//! catalogue of methods ([`crate::catalogue`]): this module probes the types and checks
//! names.
//!
//! Open params (a member the broker does not know is passed on or ignored), and why
//! (docs/broker-api.md, "Params: unknown members are refused"):
//! - the LSP lifecycle (`initialize`, `initialized`, `shutdown`, `exit`,
//!   `$/cancelRequest`): generic LSP clients send fields of their own (`processId`,
//!   `rootUri`, `capabilities`, `workDoneToken`, ...); the notifications cannot be answered;
//! - `templates/*`: their params are provider-defined by design (the types' flattened
//!   `rest`): the broker cannot know a plugin's template members.
//!
//! Every other method's params are closed. Only the top-level names are checked, without
//! reading any value (a `files/write` may carry 64 MiB): maps inside params (`env`,
//! `metadata`, `provider/configure`'s `values`) take any key by design, and other nested
//! objects are checked by what reads them (`local` refuses an unknown `limits` member).

use crate::error::{AbxError, ErrorCode};
use serde::de::{
    self, Deserialize, DeserializeOwned, Deserializer, IgnoredAny, MapAccess, Visitor,
};
use std::borrow::Cow;
use std::fmt;

/// One method's params: the type they deserialize into, and whether they are open.
pub struct ParamsEntry {
    /// The method.
    pub method: &'static str,
    /// Whether members the type does not name are accepted (see the module's list).
    pub open: bool,
    fields: fn() -> Option<&'static [&'static str]>,
    type_name: fn() -> &'static str,
}

impl ParamsEntry {
    /// The entry of `method`, whose params are `T` (open: members `T` does not name are
    /// accepted); written by the catalogue only.
    pub(crate) const fn new<T: DeserializeOwned>(method: &'static str, open: bool) -> Self {
        ParamsEntry {
            method,
            open,
            fields: fields_of::<T>,
            type_name: std::any::type_name::<T>,
        }
    }

    /// The members the params type names, as on the wire (aliases included); empty for a
    /// type that reads any member (a flattened map).
    pub fn fields(&self) -> &'static [&'static str] {
        (self.fields)().unwrap_or(&[])
    }

    /// Whether the params type reads a fixed set of members (serde's `deserialize_struct`),
    /// i.e. has no flattened member. A closed method's type always does.
    pub fn has_fixed_fields(&self) -> bool {
        (self.fields)().is_some()
    }

    /// The Rust type of the params (`std::any::type_name`).
    pub fn type_name(&self) -> &'static str {
        (self.type_name)()
    }

    /// Whether `name` is a member these params take (`also`: members the caller takes on
    /// every method of its kind, e.g. the router's `provider`).
    pub fn takes(&self, name: &str, also: &[&str]) -> bool {
        self.open || self.fields().contains(&name) || also.contains(&name)
    }

    /// Check a params object's member names: E1004 naming the unknown ones, if any.
    pub fn check<'n>(
        &self,
        names: impl IntoIterator<Item = &'n str>,
        also: &[&str],
    ) -> Result<(), AbxError> {
        if self.open {
            return Ok(());
        }
        let mut unknown: Vec<&str> = Vec::new();
        for n in names {
            if !self.takes(n, also) && !unknown.contains(&n) {
                unknown.push(n);
            }
        }
        if unknown.is_empty() {
            return Ok(());
        }
        let mut accepted: Vec<&str> = self.fields().to_vec();
        accepted.extend(also.iter().filter(|a| !self.fields().contains(a)));
        Err(unknown_members(self.method, &unknown, &accepted))
    }

    /// [`ParamsEntry::check`] on params as JSON text: only the top-level member names are
    /// read (values are skipped, never built). Text that is not an object passes: the
    /// params' typed parse reports it.
    pub fn check_text(&self, params: &str, also: &[&str]) -> Result<(), AbxError> {
        if self.open {
            return Ok(());
        }
        match member_names(params) {
            Some(names) if names.more => Err(AbxError::invalid_params(
                self.method,
                format!("params have more than {MAX_MEMBERS} members"),
            )),
            Some(names) => self.check(names.list.iter().map(|n| &**n), also),
            None => Ok(()),
        }
    }
}

/// The most members params may have (the broker refuses more, E1004: `abx_core::members`).
pub const MAX_MEMBERS: usize = 256;
/// The longest member name kept whole by [`member_names`]: a longer one is kept cut, with
/// [`CUT`] after it (no method's member is that long, so a cut name never passes as one).
pub const MAX_NAME: usize = 128;
/// What ends a member name cut by [`member_names`].
pub const CUT: &str = "…";

/// The top-level member names of params as JSON text: bounded by construction, whatever the
/// text holds.
pub struct Names<'a> {
    /// The first [`MAX_MEMBERS`] names, in order; each at most [`MAX_NAME`] bytes (a longer
    /// one cut, [`CUT`] after it).
    pub list: Vec<Cow<'a, str>>,
    /// More members followed (read and skipped, not kept).
    pub more: bool,
}

/// The top-level member names of params as JSON text, in order (values are skipped, never
/// built; at most [`MAX_MEMBERS`] names kept, each at most [`MAX_NAME`] bytes, so 10 million
/// members or a name of 60 MB cost no more than 256 short names); `None` for text that is
/// not an object.
pub fn member_names(params: &str) -> Option<Names<'_>> {
    let mut de = serde_json::Deserializer::from_str(params);
    de.deserialize_map(NamesVisitor).ok()
}

/// `name`, cut to at most [`MAX_NAME`] bytes (at a character boundary, [`CUT`] after it).
fn bounded(name: Cow<'_, str>) -> Cow<'_, str> {
    if name.len() <= MAX_NAME {
        return name;
    }
    let mut at = MAX_NAME;
    while !name.is_char_boundary(at) {
        at -= 1;
    }
    let mut cut = String::with_capacity(at + CUT.len());
    cut.push_str(&name[..at]);
    cut.push_str(CUT);
    Cow::Owned(cut)
}

/// E1004 for members `method` does not take: the message names them and the method; the
/// suggestion lists what it takes and says a newer API may have added them (`data.unknown`,
/// `data.accepted`: the same as lists).
pub fn unknown_members(method: &str, unknown: &[&str], accepted: &[&str]) -> AbxError {
    let quote = |l: &[&str]| {
        l.iter()
            .map(|n| format!("'{n}'"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let (what, it) = match unknown.len() {
        1 => ("unknown member", "it"),
        _ => ("unknown members", "them"),
    };
    let takes = match accepted.len() {
        0 => format!("'{method}' takes no params"),
        _ => format!("'{method}' takes {}", quote(accepted)),
    };
    AbxError::new(
        ErrorCode::InvalidParams,
        &[
            ("method", method),
            ("detail", &format!("{what} {}", quote(unknown))),
        ],
    )
    .with_suggestion(format!(
        "{takes} (docs/broker-api.md). If a newer abx API added {it}, this broker is older \
         than your client: upgrade abx (and restart the broker: 'abx broker stop'); otherwise \
         leave {it} out."
    ))
    .with_data("unknown", unknown.to_vec())
    .with_data("accepted", accepted.to_vec())
}

/// The entry of `method`; `None` for a method that is not in the catalogue (an unknown one,
/// or a composition root's own that parses its params itself).
pub fn params_of(method: &str) -> Option<&'static ParamsEntry> {
    crate::catalogue::method(method).map(|m| &m.params)
}

/// Every method's entry, in the catalogue's order.
pub fn params_table() -> impl Iterator<Item = &'static ParamsEntry> + Clone {
    crate::catalogue::METHODS.iter().map(|m| &m.params)
}

/// The member names serde reads for `T`: `Some` for a struct (its fields), `None` for a type
/// read as a map (a flattened member) or anything else.
fn fields_of<T: DeserializeOwned>() -> Option<&'static [&'static str]> {
    match T::deserialize(Probe) {
        Err(Probed::Struct(fields)) => Some(fields),
        _ => None,
    }
}

/// A deserializer that only learns how a type reads itself: every call fails, a struct's
/// with the list of its fields.
struct Probe;

#[derive(Debug)]
enum Probed {
    Struct(&'static [&'static str]),
    Other,
}

impl fmt::Display for Probed {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("probed")
    }
}

impl std::error::Error for Probed {}

impl de::Error for Probed {
    fn custom<T: fmt::Display>(_: T) -> Self {
        Probed::Other
    }
}

impl<'de> Deserializer<'de> for Probe {
    type Error = Probed;

    fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Probed> {
        Err(Probed::Other)
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _: &'static str,
        fields: &'static [&'static str],
        _: V,
    ) -> Result<V::Value, Probed> {
        Err(Probed::Struct(fields))
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf
        option unit unit_struct newtype_struct seq tuple tuple_struct map enum identifier
        ignored_any
    }
}

/// The top-level member names of an object, borrowed from the text where they have no
/// escapes; values are skipped.
struct NamesVisitor;

/// A member name.
struct Name<'a>(Cow<'a, str>);

impl<'de> Deserialize<'de> for Name<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Cow<'de, str>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E>(self, s: &'de str) -> Result<Self::Value, E> {
                Ok(bounded(Cow::Borrowed(s)))
            }
            // Made (escaped): never more of it than is kept.
            fn visit_str<E>(self, s: &str) -> Result<Self::Value, E> {
                Ok(Cow::Owned(bounded(Cow::Borrowed(s)).into_owned()))
            }
        }
        d.deserialize_str(V).map(Name)
    }
}

impl<'de> Visitor<'de> for NamesVisitor {
    type Value = Names<'de>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an object")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut names = Names {
            list: Vec::new(),
            more: false,
        };
        loop {
            if names.list.len() == MAX_MEMBERS {
                // Past the cap: the rest is read to tell an object from broken text, and
                // nothing of it kept (a name is skipped, never made).
                while map.next_key::<IgnoredAny>()?.is_some() {
                    map.next_value::<IgnoredAny>()?;
                    names.more = true;
                }
                return Ok(names);
            }
            let Some(Name(k)) = map.next_key()? else {
                return Ok(names);
            };
            map.next_value::<IgnoredAny>()?;
            names.list.push(k);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::features::PROVIDER_METHODS;

    #[test]
    fn members_come_from_the_types_as_on_the_wire() {
        let create = params_of("sandbox/create").unwrap();
        assert!(!create.open);
        assert_eq!(
            create.fields(),
            ["provider", "template", "timeout", "env", "metadata", "network", "limits", "mounts"]
        );
        // camelCase and renames as the wire has them, hidden members included.
        let run = params_of("exec/run").unwrap().fields();
        for m in ["stdinEncoding", "maxOutput", "pty", "_meta"] {
            assert!(run.contains(&m), "{m}: {run:?}");
        }
        assert!(params_of("provider/install")
            .unwrap()
            .fields()
            .contains(&"ref"));
        assert!(params_of("provider/update")
            .unwrap()
            .fields()
            .contains(&"ref"));
        assert_eq!(params_of("broker/ping").unwrap().fields(), [] as [&str; 0]);
        assert!(params_of("no/such").is_none());
    }

    #[test]
    fn closed_params_are_types_with_fixed_members_and_open_ones_are_listed() {
        let open: Vec<&str> = params_table()
            .filter(|e| e.open)
            .map(|e| e.method)
            .collect();
        assert_eq!(
            open,
            [
                "initialize",
                "initialized",
                "shutdown",
                "exit",
                "$/cancelRequest",
                "templates/list",
                "templates/init",
                "templates/build",
                "templates/pull",
                "templates/remove",
                "templates/import",
            ],
            "docs/broker-api.md lists the open params and why: keep it in step"
        );
        for e in params_table() {
            assert!(
                e.open || e.has_fixed_fields(),
                "{}: closed, but {} reads any member (a flattened map)",
                e.method,
                e.type_name()
            );
            assert_eq!(params_of(e.method).map(|x| x.method), Some(e.method));
        }
        for m in PROVIDER_METHODS {
            assert!(params_of(m).is_some(), "{m} is not in the params table");
        }
    }

    #[test]
    fn unknown_members_are_e1004_naming_them_and_the_method() {
        let e = params_of("sandbox/create").unwrap();
        e.check(["template", "timeout"], &[]).unwrap();
        let err = e
            .check(["template", "volumes", "binds", "volumes"], &[])
            .unwrap_err();
        assert_eq!(err.code, ErrorCode::InvalidParams);
        assert_eq!(
            err.message,
            "Invalid params for 'sandbox/create': unknown members 'volumes', 'binds'"
        );
        assert!(
            err.suggestion
                .starts_with("'sandbox/create' takes 'provider', 'template',"),
            "{}",
            err.suggestion
        );
        assert!(err.suggestion.contains("upgrade abx"), "{}", err.suggestion);
        assert_eq!(err.data["unknown"], serde_json::json!(["volumes", "binds"]));
        // A member every method of the caller's kind takes.
        let info = params_of("sandbox/info").unwrap();
        info.check(["sandbox", "provider"], &["provider"]).unwrap();
        let err = info.check(["sandbox", "x"], &["provider"]).unwrap_err();
        assert_eq!(
            err.data["accepted"],
            serde_json::json!(["sandbox", "provider"])
        );
        let err = params_of("broker/ping")
            .unwrap()
            .check(["x"], &[])
            .unwrap_err();
        assert!(err.suggestion.starts_with("'broker/ping' takes no params"));
        // Open params take anything.
        params_of("initialize")
            .unwrap()
            .check(["processId", "rootUri"], &[])
            .unwrap();
        params_of("templates/pull")
            .unwrap()
            .check(["template", "platform"], &[])
            .unwrap();
    }

    #[test]
    fn text_is_checked_by_its_names_only() {
        let w = params_of("files/write").unwrap();
        let big = format!(
            r#"{{"sandbox":"s","path":"p","data":"{}","encoding":"base64"}}"#,
            "QUJD".repeat(1 << 16)
        );
        w.check_text(&big, &[]).unwrap();
        let e = w
            .check_text(
                r#"{"sandbox":"s","p\u0061th":"p","data":"","mod":[1,{"x":2}]}"#,
                &[],
            )
            .unwrap_err();
        assert!(e.message.ends_with("unknown member 'mod'"), "{}", e.message);
        // Not an object: the typed parse says what is wrong.
        w.check_text("[1]", &[]).unwrap();
        w.check_text("3", &[]).unwrap();
    }

    /// The names collected are bounded by construction: at most 256 of them (the rest read
    /// and skipped), each at most 128 bytes (a longer one cut and marked, so it never passes
    /// as a member the method takes), however many members and however long their names.
    #[test]
    fn member_names_are_bounded_in_count_and_length() {
        let mut many = String::from("{");
        for i in 0..100_000 {
            many.push_str(&format!(r#""m{i}":{{"x":[1,2]}},"#));
        }
        many.push_str(r#""sandbox":"s"}"#);
        let n = member_names(&many).unwrap();
        assert_eq!(n.list.len(), MAX_MEMBERS);
        assert!(n.more);
        assert_eq!(n.list[0], "m0");
        assert_eq!(n.list[MAX_MEMBERS - 1], format!("m{}", MAX_MEMBERS - 1));
        // Exactly the cap: nothing more.
        let cap: Vec<String> = (0..MAX_MEMBERS).map(|i| format!(r#""m{i}":0"#)).collect();
        let cap = format!("{{{}}}", cap.join(","));
        assert!(!member_names(&cap).unwrap().more);
        // Broken text past the cap is still not an object.
        assert!(member_names(&many[..many.len() - 2]).is_none());
        let e = params_of("files/write")
            .unwrap()
            .check_text(&many, &[])
            .unwrap_err();
        assert!(e.message.contains("more than 256 members"), "{}", e.message);
        // A name of 1 MB (escaped, so it is made, not borrowed) is kept cut.
        let long = format!(r#"{{"sandbox":"s","é{}":1}}"#, "é".repeat(1 << 19));
        let n = member_names(&long).unwrap();
        assert_eq!(n.list.len(), 2);
        assert!(n.list[1].len() <= MAX_NAME + CUT.len());
        assert!(n.list[1].ends_with(CUT) && n.list[1].starts_with("éé"));
        let e = params_of("files/write")
            .unwrap()
            .check_text(&long, &[])
            .unwrap_err();
        assert!(e.message.contains(CUT), "{}", e.message);
        assert!(e.message.len() < 1024, "{}", e.message.len());
        // A long name that starts like a member the method takes is still unknown.
        let like = format!(r#"{{"sandbox{}":"s"}}"#, "x".repeat(200));
        assert!(params_of("files/write")
            .unwrap()
            .check_text(&like, &[])
            .is_err());
    }
}
