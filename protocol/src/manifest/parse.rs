//! Parsing: the TOML read with spans, every field checked, the first problem reported as
//! E8014 naming its line and key (E8003 for a protocol other than EPP/1), never quoting a
//! value.

use super::model::*;
use super::rules::*;
use crate::error::{AbxError, ErrorCode};
use crate::features;
use serde::de::{Deserializer, MapAccess, Visitor};
use serde::Deserialize;
use serde_json::Value;
use std::collections::BTreeMap;
use std::fmt;
use toml::Spanned;

// ---------------------------------------------------------------------------------------
// Parsing.

/// A map that keeps the document order of its keys.
struct Ordered<V>(Vec<(String, V)>);

impl<'de, V: Deserialize<'de>> Deserialize<'de> for Ordered<V> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V2<V>(std::marker::PhantomData<V>);
        impl<'de, V: Deserialize<'de>> Visitor<'de> for V2<V> {
            type Value = Ordered<V>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a table")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<Self::Value, A::Error> {
                let mut out = Vec::new();
                while let Some(k) = m.next_key::<String>()? {
                    let v = m.next_value::<V>()?;
                    out.push((k, v));
                }
                Ok(Ordered(out))
            }
        }
        d.deserialize_map(V2(std::marker::PhantomData))
    }
}

/// One string or a list of strings.
enum OneOrMany {
    One(String),
    Many(Vec<Spanned<String>>),
}

impl<'de> Deserialize<'de> for OneOrMany {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = OneOrMany;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string or a list of strings")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<OneOrMany, E> {
                Ok(OneOrMany::One(v.to_owned()))
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<OneOrMany, A::Error> {
                let mut out = Vec::new();
                while let Some(x) = seq.next_element::<Spanned<String>>()? {
                    out.push(x);
                }
                Ok(OneOrMany::Many(out))
            }
        }
        d.deserialize_any(V)
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawManifest {
    schema: Option<Spanned<i64>>,
    id: Option<Spanned<String>>,
    name: Option<Spanned<String>>,
    version: Option<Spanned<String>>,
    protocol: Option<Spanned<String>>,
    description: Option<Spanned<String>>,
    features: Option<Spanned<Vec<Spanned<String>>>>,
    inherits: Option<Spanned<Vec<Spanned<String>>>>,
    runtime: Option<RawRuntime>,
    config: Option<Ordered<RawConfigKey>>,
    security: Option<RawSecurity>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRuntime {
    command: Option<Spanned<Vec<Spanned<String>>>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfigKey {
    description: Option<Spanned<String>>,
    default: Option<Spanned<toml::Value>>,
    required: Option<Spanned<bool>>,
    secret: Option<Spanned<bool>>,
    env: Option<Spanned<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSecurity {
    network: Option<Spanned<OneOrMany>>,
    filesystem: Option<Spanned<OneOrMany>>,
    spawns_processes: Option<Spanned<bool>>,
}

/// 1-based line of a byte offset.
fn line_of(text: &str, offset: usize) -> usize {
    let end = offset.min(text.len());
    text.as_bytes()[..end]
        .iter()
        .filter(|b| **b == b'\n')
        .count()
        + 1
}

/// The `[table]` header in force at a byte offset, if any.
fn table_at(text: &str, offset: usize) -> Option<String> {
    let end = offset.min(text.len());
    // The current line may itself be the header.
    let line_end = text[end..].find('\n').map_or(text.len(), |i| end + i);
    text[..line_end].lines().rev().find_map(|l| {
        let t = l.trim();
        if t.starts_with('[') {
            let inner = t.trim_start_matches('[');
            let close = inner.find(']')?;
            Some(inner[..close].trim().to_owned())
        } else {
            None
        }
    })
}

struct Ctx<'a> {
    text: &'a str,
    /// The id, once known, for E8003.
    id: Option<String>,
}

impl Ctx<'_> {
    fn err_at(
        &self,
        span: std::ops::Range<usize>,
        key: &str,
        problem: impl fmt::Display,
    ) -> AbxError {
        invalid(format!(
            "line {}, key '{key}': {problem}",
            line_of(self.text, span.start)
        ))
    }

    /// An error placed on the first line holding one of `candidates` (tables defined by a
    /// `[header]` carry no span).
    fn err_near(&self, candidates: &[String], key: &str, problem: impl fmt::Display) -> AbxError {
        match find_line(self.text, candidates) {
            Some(line) => invalid(format!("line {line}, key '{key}': {problem}")),
            None => invalid(format!("key '{key}': {problem}")),
        }
    }

    fn missing(&self, key: &str, table: Option<&str>) -> AbxError {
        match table {
            Some(t) => match find_line(self.text, &[format!("[{t}]")]) {
                Some(line) => invalid(format!(
                    "line {line}: [{t}] has no '{key}' (it is required)"
                )),
                None => invalid(format!("[{t}] has no '{key}' (it is required)")),
            },
            None => invalid(format!("the required key '{key}' is missing")),
        }
    }
}

/// 1-based number of the first line whose text (spaces removed) contains a candidate.
fn find_line(text: &str, candidates: &[String]) -> Option<usize> {
    text.lines()
        .position(|l| {
            let squeezed: String = l.chars().filter(|c| !c.is_whitespace()).collect();
            candidates.iter().any(|c| squeezed.contains(c.as_str()))
        })
        .map(|i| i + 1)
}

fn config_candidates(name: &str) -> Vec<String> {
    vec![
        format!("[config.{name}]"),
        format!("[config.\"{name}\"]"),
        format!("config.{name}."),
        format!("{name}="),
        format!("\"{name}\"="),
    ]
}

fn invalid(detail: impl Into<String>) -> AbxError {
    AbxError::new(ErrorCode::InvalidManifest, &[("detail", &detail.into())])
}

/// Rewrite a deserializer message so that it never quotes a value and reads as ours.
fn sanitize(msg: &str) -> String {
    let msg = msg.trim().replace('\n', "; ");
    if let Some(rest) = msg.strip_prefix("unknown field `") {
        if let Some(end) = rest.find('`') {
            let key = &rest[..end];
            let expected: Vec<&str> = rest[end + 1..]
                .split('`')
                .enumerate()
                .filter(|(i, _)| i % 2 == 1)
                .map(|(_, s)| s)
                .collect();
            return if expected.is_empty() {
                format!("unknown key '{key}'")
            } else {
                format!("unknown key '{key}' (known keys: {})", expected.join(", "))
            };
        }
    }
    for prefix in ["invalid type: ", "invalid value: "] {
        if let Some(rest) = msg.strip_prefix(prefix) {
            let (found, expected) = match rest.split_once(", expected ") {
                Some((f, e)) => (f, Some(e)),
                None => (rest, None),
            };
            let kind = found
                .split(['"', '`', '\''])
                .next()
                .unwrap_or("")
                .trim()
                .to_owned();
            let what = if prefix.starts_with("invalid type") {
                "wrong type"
            } else {
                "invalid value"
            };
            return match (expected, kind.is_empty()) {
                (Some(e), false) => format!("{what}: expected {e}, found {kind}"),
                (Some(e), true) => format!("{what}: expected {e}"),
                (None, false) => format!("{what}: found {kind}"),
                (None, true) => what.to_owned(),
            };
        }
    }
    msg
}

fn toml_error(text: &str, e: &toml::de::Error) -> AbxError {
    let msg = sanitize(e.message());
    match e.span() {
        Some(span) => {
            let line = line_of(text, span.start);
            // Name the key the error sits on when the span covers one.
            let snippet = text.get(span.clone()).unwrap_or("");
            let table = table_at(text, span.start);
            // Only a key (followed by '=' or '.'), never a value, is quoted.
            let after = text[span.end.min(text.len())..].trim_start_matches([' ', '\t']);
            let line_start = text[..span.start.min(text.len())]
                .rfind('\n')
                .map_or(0, |i| i + 1);
            let before = text[line_start..span.start.min(text.len())].trim_end();
            let key = if is_bare_key(snippet) && (after.starts_with('=') || after.starts_with('.'))
            {
                Some(snippet)
            } else {
                // A value: name the key in front of its '='.
                before
                    .strip_suffix('=')
                    .map(str::trim)
                    .filter(|k| is_bare_key(k))
            };
            match (key, table) {
                (Some(k), Some(t)) if !msg.contains(&format!("'{k}'")) => {
                    invalid(format!("line {line}, key '{t}.{k}': {msg}"))
                }
                (Some(k), None) if !msg.contains(&format!("'{k}'")) => {
                    invalid(format!("line {line}, key '{k}': {msg}"))
                }
                (_, Some(t)) => invalid(format!("line {line} (in [{t}]): {msg}")),
                _ => invalid(format!("line {line}: {msg}")),
            }
        }
        None => invalid(msg),
    }
}

fn check_text(ctx: &Ctx, v: &Spanned<String>, key: &str, max: usize) -> Result<String, AbxError> {
    let s = v.get_ref();
    if s.trim().is_empty() {
        return Err(ctx.err_at(v.span(), key, "must not be empty"));
    }
    if s.len() > max {
        return Err(ctx.err_at(v.span(), key, format!("is longer than {max} bytes")));
    }
    if s.chars().any(|c| c.is_control() && c != '\n' && c != '\t') {
        return Err(ctx.err_at(v.span(), key, "contains control characters"));
    }
    Ok(s.clone())
}

fn strings(list: Option<Spanned<OneOrMany>>) -> Vec<Spanned<String>> {
    let Some(list) = list else {
        return Vec::new();
    };
    let span = list.span();
    match list.into_inner() {
        OneOrMany::One(s) => vec![Spanned::new(span, s)],
        OneOrMany::Many(v) => v,
    }
}

fn to_json(
    ctx: &Ctx,
    key: &str,
    span: std::ops::Range<usize>,
    v: toml::Value,
) -> Result<Value, AbxError> {
    Ok(match v {
        toml::Value::String(s) => Value::String(s),
        toml::Value::Integer(i) => Value::from(i),
        toml::Value::Float(f) => match serde_json::Number::from_f64(f) {
            Some(n) => Value::Number(n),
            None => return Err(ctx.err_at(span, key, "must be a finite number")),
        },
        toml::Value::Boolean(b) => Value::Bool(b),
        toml::Value::Datetime(d) => Value::String(d.to_string()),
        toml::Value::Array(a) => Value::Array(
            a.into_iter()
                .map(|x| to_json(ctx, key, span.clone(), x))
                .collect::<Result<_, _>>()?,
        ),
        toml::Value::Table(t) => Value::Object(
            t.into_iter()
                .map(|(k, x)| Ok((k, to_json(ctx, key, span.clone(), x)?)))
                .collect::<Result<_, AbxError>>()?,
        ),
    })
}

/// Parse and validate an `abx-provider.toml`.
///
/// Errors are E8014 `Invalid abx-provider.toml: line N, key 'K': ...` (E8003 for a
/// `protocol` other than `EPP/1`). They never quote configuration values.
pub fn parse(text: &str) -> Result<Manifest, AbxError> {
    let raw: RawManifest = toml::from_str(text).map_err(|e| toml_error(text, &e))?;
    let mut ctx = Ctx { text, id: None };

    // schema first: a future schema may change everything else.
    let schema = raw.schema.ok_or_else(|| ctx.missing("schema", None))?;
    if *schema.get_ref() != i64::from(SCHEMA) {
        return Err(ctx.err_at(
            schema.span(),
            "schema",
            format!(
                "schema {} is not supported (this broker reads schema {SCHEMA})",
                schema.get_ref()
            ),
        ));
    }

    let id = raw.id.ok_or_else(|| ctx.missing("id", None))?;
    if !is_id(id.get_ref()) {
        return Err(ctx.err_at(
            id.span(),
            "id",
            format!(
                "'{}' is not a valid id (1 to 63 lowercase letters, digits and '-', not starting with '-')",
                id.get_ref().escape_debug()
            ),
        ));
    }
    ctx.id = Some(id.get_ref().clone());

    let protocol = raw.protocol.ok_or_else(|| ctx.missing("protocol", None))?;
    if protocol.get_ref() != PROTOCOL {
        let p: String = protocol.get_ref().chars().take(64).collect();
        return Err(AbxError::new(
            ErrorCode::ProtocolMismatch,
            &[
                ("provider", ctx.id.as_deref().unwrap_or("?")),
                ("protocol", &p.escape_debug().to_string()),
            ],
        )
        .with_data("line", line_of(text, protocol.span().start))
        .with_suggestion(format!(
            "line {}, key 'protocol': this broker speaks EPP/1; install a version of the provider made for it.",
            line_of(text, protocol.span().start)
        )));
    }

    let name = raw.name.ok_or_else(|| ctx.missing("name", None))?;
    let name = check_text(&ctx, &name, "name", 200)?;
    let version = raw.version.ok_or_else(|| ctx.missing("version", None))?;
    let version_s = check_text(&ctx, &version, "version", 64)?;
    if version_s.chars().any(char::is_whitespace) {
        return Err(ctx.err_at(version.span(), "version", "must not contain spaces"));
    }
    let description = match raw.description {
        Some(d) if !d.get_ref().is_empty() => check_text(&ctx, &d, "description", 4096)?,
        _ => String::new(),
    };

    let mut feats: Vec<String> = Vec::new();
    if let Some(list) = raw.features {
        for f in list.into_inner() {
            if !features::is_known(f.get_ref()) {
                return Err(ctx.err_at(
                    f.span(),
                    "features",
                    format!(
                        "unknown feature '{}' (known: {})",
                        f.get_ref().escape_debug(),
                        features::ALL.join(", ")
                    ),
                ));
            }
            if feats.iter().any(|x| x == f.get_ref()) {
                return Err(ctx.err_at(
                    f.span(),
                    "features",
                    format!("'{}' is listed twice", f.get_ref()),
                ));
            }
            feats.push(f.into_inner());
        }
    }

    let mut inherits: Vec<String> = Vec::new();
    if let Some(list) = raw.inherits {
        for p in list.into_inner() {
            if !is_id(p.get_ref()) {
                return Err(ctx.err_at(
                    p.span(),
                    "inherits",
                    format!(
                        "'{}' is not a valid provider id",
                        p.get_ref().escape_debug()
                    ),
                ));
            }
            if Some(p.get_ref()) == ctx.id.as_ref() {
                return Err(ctx.err_at(
                    p.span(),
                    "inherits",
                    "a provider cannot inherit from itself",
                ));
            }
            if !inherits.contains(p.get_ref()) {
                inherits.push(p.into_inner());
            }
        }
    }

    let runtime = raw.runtime.ok_or_else(|| ctx.missing("runtime", None))?;
    let command = runtime
        .command
        .ok_or_else(|| ctx.missing("command", Some("runtime")))?;
    let cmd_span = command.span();
    let command = command.into_inner();
    if command.is_empty() {
        return Err(ctx.err_at(
            cmd_span,
            "runtime.command",
            "must name a program (it is empty)",
        ));
    }
    let mut argv = Vec::with_capacity(command.len());
    for (i, arg) in command.into_iter().enumerate() {
        let a = arg.get_ref();
        if a.contains('\0') {
            return Err(ctx.err_at(arg.span(), "runtime.command", "contains a NUL character"));
        }
        if i == 0 && a.trim().is_empty() {
            return Err(ctx.err_at(arg.span(), "runtime.command", "the program name is empty"));
        }
        let shown = a.escape_debug().to_string();
        match classify_arg(i, a) {
            ArgKind::Plain | ArgKind::Inside(_) => {}
            ArgKind::Absolute => {
                return Err(ctx.err_at(
                    arg.span(),
                    "runtime.command",
                    format!(
                        "'{shown}' is an absolute path, outside the plugin root (name a program found in PATH, or a file in the plugin as './file')"
                    ),
                ))
            }
            ArgKind::Escapes => {
                return Err(ctx.err_at(
                    arg.span(),
                    "runtime.command",
                    format!("'{shown}' resolves outside the plugin root"),
                ))
            }
            ArgKind::Root => {
                return Err(ctx.err_at(
                    arg.span(),
                    "runtime.command",
                    format!("'{shown}' names the plugin root, not a file in it"),
                ))
            }
        }
        argv.push(arg.into_inner());
    }

    let mut config = BTreeMap::new();
    let mut config_order = Vec::new();
    if let Some(table) = raw.config {
        for (name, key) in table.0 {
            if !is_valid_config_key(&name) {
                return Err(ctx.err_near(
                    &config_candidates(&name),
                    &format!("config.{}", name.escape_debug()),
                    "config key names must match ^[a-z][a-z0-9_]*$",
                ));
            }
            let kpath = format!("config.{name}");
            let secret = key.secret.as_ref().is_some_and(|s| *s.get_ref());
            let default = match key.default {
                Some(d) => {
                    let span = d.span();
                    // Never name a secret default's value; to_json never quotes values.
                    Some(to_json(
                        &ctx,
                        &format!("{kpath}.default"),
                        span,
                        d.into_inner(),
                    )?)
                }
                None => None,
            };
            let env = match key.env {
                Some(e) => {
                    if !is_valid_env_name(e.get_ref()) {
                        return Err(ctx.err_at(
                            e.span(),
                            &format!("{kpath}.env"),
                            format!(
                                "'{}' is not a valid environment variable name (^[A-Z_][A-Z0-9_]*$)",
                                e.get_ref().escape_debug()
                            ),
                        ));
                    }
                    Some(e.into_inner())
                }
                None => None,
            };
            let description = match key.description {
                Some(d) if !d.get_ref().is_empty() => {
                    check_text(&ctx, &d, &format!("{kpath}.description"), 4096)?
                }
                _ => String::new(),
            };
            config_order.push(name.clone());
            config.insert(
                name,
                ConfigKey {
                    description,
                    default,
                    required: key.required.is_some_and(|r| r.into_inner()),
                    secret,
                    env,
                },
            );
        }
    }

    let mut security = Security::default();
    if let Some(sec) = raw.security {
        let network = strings(sec.network);
        if network.len() > 1 && network.iter().any(|n| n.get_ref() == "*") {
            let star = network
                .iter()
                .find(|n| n.get_ref() == "*")
                .expect("checked");
            return Err(ctx.err_at(
                star.span(),
                "security.network",
                "'*' (any host) must be the only entry",
            ));
        }
        for n in network {
            if let Err(why) = check_network(n.get_ref()) {
                return Err(ctx.err_at(
                    n.span(),
                    "security.network",
                    format!("'{}' {why}", n.get_ref().escape_debug()),
                ));
            }
            if !security.network.contains(n.get_ref()) {
                security.network.push(n.into_inner());
            }
        }
        for f in strings(sec.filesystem) {
            if !FILESYSTEM_AREAS.contains(&f.get_ref().as_str()) {
                return Err(ctx.err_at(
                    f.span(),
                    "security.filesystem",
                    format!(
                        "unknown area '{}' (known: {})",
                        f.get_ref().escape_debug(),
                        FILESYSTEM_AREAS.join(", ")
                    ),
                ));
            }
            if !security.filesystem.contains(f.get_ref()) {
                security.filesystem.push(f.into_inner());
            }
        }
        security.spawns_processes = sec.spawns_processes.is_some_and(|s| s.into_inner());
    }

    Ok(Manifest {
        schema: SCHEMA,
        id: id.into_inner(),
        name,
        version: version_s,
        protocol: protocol.into_inner(),
        description,
        features: feats,
        inherits,
        runtime: Runtime { command: argv },
        config,
        config_order,
        security,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"schema = 1
id = "opensandbox"
name = "OpenSandbox"
version = "0.1.0"
protocol = "EPP/1"
description = "Sandboxes on an OpenSandbox server."
features = ["sandbox.lifecycle", "exec.run", "files.rw"]

[runtime]
command = ["node", "./provider.mjs"]

[config.base_url]
description = "Server URL"
default = "http://127.0.0.1:8080"

[config.api_key]
description = "API key"
required = true
secret = true
default = "sk-hunter2-SECRET"
env = "OPENSANDBOX_API_KEY"

[config.ready_timeout]
description = "Seconds to wait"
default = 60

[security]
network = ["*"]
filesystem = "data_dir"
spawns_processes = false
"#;

    fn err(text: &str) -> AbxError {
        parse(text).expect_err("should be refused")
    }

    fn with(replace: &str, by: &str) -> String {
        assert!(GOOD.contains(replace), "{replace}");
        GOOD.replacen(replace, by, 1)
    }

    #[test]
    fn parses_a_good_manifest() {
        let m = parse(GOOD).unwrap();
        assert_eq!(m.id, "opensandbox");
        assert_eq!(m.schema, 1);
        assert_eq!(m.runtime.command, vec!["node", "./provider.mjs"]);
        assert_eq!(m.config_order, vec!["base_url", "api_key", "ready_timeout"]);
        assert_eq!(m.config["ready_timeout"].default, Some(Value::from(60)));
        assert!(m.config["api_key"].secret && m.config["api_key"].required);
        assert_eq!(
            m.config["api_key"].env.as_deref(),
            Some("OPENSANDBOX_API_KEY")
        );
        assert_eq!(m.security.network, vec!["*"]);
        assert_eq!(m.security.filesystem, vec!["data_dir"]);
        assert!(!m.security.spawns_processes);
        assert_eq!(m.runtime_paths(), vec![(1, "provider.mjs".to_string())]);
        let order: Vec<&str> = m.config_in_order().map(|(k, _)| k).collect();
        assert_eq!(order, vec!["base_url", "api_key", "ready_timeout"]);
    }

    #[test]
    fn minimal_manifest_has_restrictive_defaults() {
        let m = parse(
            "schema = 1\nid = \"x\"\nname = \"X\"\nversion = \"1\"\nprotocol = \"EPP/1\"\n[runtime]\ncommand = [\"./run\"]\n",
        )
        .unwrap();
        assert!(m.features.is_empty() && m.config.is_empty());
        assert_eq!(m.security, Security::default());
        assert_eq!(m.runtime_paths(), vec![(0, "run".to_string())]);
    }

    #[test]
    fn secret_defaults_never_serialize_or_show() {
        let m = parse(GOOD).unwrap();
        let json = serde_json::to_string(&m).unwrap();
        assert!(!json.contains("hunter2"), "{json}");
        assert!(json.contains("http://127.0.0.1:8080"));
        assert!(json.contains("\"configOrder\""));
        assert!(json.contains("\"spawnsProcesses\""));
        let red = m.redacted_config();
        let s = red.to_string();
        assert!(!s.contains("hunter2"), "{s}");
        assert_eq!(red[0]["name"], "base_url");
        assert_eq!(red[0]["default"], "http://127.0.0.1:8080");
        assert_eq!(red[1]["name"], "api_key");
        assert_eq!(red[1]["secret"], true);
        assert!(red[1].get("default").is_none());
        // A JSON round trip keeps everything but the secret default.
        let back: Manifest = serde_json::from_str(&json).unwrap();
        assert_eq!(back.config["api_key"].default, None);
        assert_eq!(back.config["base_url"], m.config["base_url"]);
        assert_eq!(back.config_order, m.config_order);
    }

    #[test]
    fn errors_in_a_secret_key_never_quote_values() {
        for (from, to) in [
            ("secret = true\n", "secret = \"sk-hunter2-SECRET\"\n"),
            ("required = true\n", "required = \"sk-hunter2-SECRET\"\n"),
            (
                "env = \"OPENSANDBOX_API_KEY\"",
                "env = [\"sk-hunter2-SECRET\"]",
            ),
            ("description = \"API key\"", "description = 1234567"),
            ("default = \"sk-hunter2-SECRET\"", "default = nan"),
        ] {
            let e = err(&with(from, to));
            assert_eq!(e.code, ErrorCode::InvalidManifest, "{e}");
            let shown = format!("{e} {} {:?}", e.suggestion, e.data);
            assert!(!shown.contains("hunter2"), "{shown}");
            assert!(!shown.contains("1234567"), "{shown}");
            assert!(shown.contains("line "), "{shown}");
        }
    }

    #[test]
    fn unknown_keys_are_named_with_their_line() {
        let e = err(&with("[runtime]\n", "colour = \"red\"\n[runtime]\n"));
        assert_eq!(e.code, ErrorCode::InvalidManifest);
        assert!(e.message.contains("line 9"), "{}", e.message);
        assert!(e.message.contains("unknown key 'colour'"), "{}", e.message);
        let e = err(&with("secret = true", "secrett = true"));
        assert!(
            e.message.contains("line 19 (in [config.api_key])"),
            "{}",
            e.message
        );
        assert!(e.message.contains("'secrett'"), "{}", e.message);
        let e = err(&with("spawns_processes = false", "spawn_processes = false"));
        assert!(e.message.contains("'spawn_processes'"), "{}", e.message);
        assert!(e.message.contains("line 30"), "{}", e.message);
        let e = err(&with("[runtime]\ncommand", "[runtime]\nargv = []\ncommand"));
        assert!(e.message.contains("unknown key 'argv'"), "{}", e.message);
    }

    #[test]
    fn field_checks_name_line_and_key() {
        let cases: &[(&str, &str, &str, &str)] = &[
            (
                "schema = 1",
                "schema = 2",
                "line 1, key 'schema'",
                "schema 2 is not supported",
            ),
            (
                "id = \"opensandbox\"",
                "id = \"Open_Sandbox\"",
                "line 2, key 'id'",
                "not a valid id",
            ),
            (
                "id = \"opensandbox\"",
                "id = \"-x\"",
                "line 2, key 'id'",
                "not a valid id",
            ),
            (
                "name = \"OpenSandbox\"",
                "name = \"\"",
                "line 3, key 'name'",
                "must not be empty",
            ),
            (
                "version = \"0.1.0\"",
                "version = \"0 1\"",
                "line 4, key 'version'",
                "spaces",
            ),
            (
                "\"files.rw\"]",
                "\"files.wacth\"]",
                "line 7, key 'features'",
                "unknown feature 'files.wacth'",
            ),
            (
                "\"files.rw\"]",
                "\"exec.run\"]",
                "line 7, key 'features'",
                "listed twice",
            ),
            (
                "[\"node\", \"./provider.mjs\"]",
                "[]",
                "line 10, key 'runtime.command'",
                "empty",
            ),
            (
                "[\"node\", \"./provider.mjs\"]",
                "[\"node\", \"../x.mjs\"]",
                "line 10, key 'runtime.command'",
                "outside the plugin root",
            ),
            (
                "[\"node\", \"./provider.mjs\"]",
                "[\"node\", \"./a/../../x\"]",
                "line 10, key 'runtime.command'",
                "outside the plugin root",
            ),
            (
                "[\"node\", \"./provider.mjs\"]",
                "[\"/usr/bin/node\", \"x\"]",
                "line 10, key 'runtime.command'",
                "absolute path",
            ),
            (
                "[config.base_url]",
                "[config.BaseUrl]",
                "line 12, key 'config.BaseUrl'",
                "^[a-z][a-z0-9_]*$",
            ),
            (
                "env = \"OPENSANDBOX_API_KEY\"",
                "env = \"api-key\"",
                "line 21, key 'config.api_key.env'",
                "not a valid environment variable",
            ),
            (
                "network = [\"*\"]",
                "network = [\"*\", \"example.com\"]",
                "line 28, key 'security.network'",
                "only entry",
            ),
            (
                "network = [\"*\"]",
                "network = [\"exa mple.com\"]",
                "line 28, key 'security.network'",
                "not a host",
            ),
            (
                "network = [\"*\"]",
                "network = [\"example.com:99999\"]",
                "line 28, key 'security.network'",
                "invalid port",
            ),
            (
                "filesystem = \"data_dir\"",
                "filesystem = [\"home\"]",
                "line 29, key 'security.filesystem'",
                "unknown area 'home'",
            ),
            (
                "spawns_processes = false",
                "spawns_processes = \"no\"",
                "line 30",
                "expected a boolean",
            ),
        ];
        for (from, to, place, what) in cases {
            let e = err(&with(from, to));
            assert_eq!(e.code, ErrorCode::InvalidManifest, "{to}: {e}");
            assert!(
                e.message.starts_with("Invalid abx-provider.toml: "),
                "{}",
                e.message
            );
            assert!(e.message.contains(place), "{to}: {}", e.message);
            assert!(e.message.contains(what), "{to}: {}", e.message);
        }
    }

    #[test]
    fn missing_keys_are_named() {
        let e = err(&with("id = \"opensandbox\"\n", ""));
        assert!(e.message.contains("'id' is missing"), "{}", e.message);
        let e = err(&with("command = [\"node\", \"./provider.mjs\"]\n", ""));
        assert!(
            e.message.contains("line 9: [runtime] has no 'command'"),
            "{}",
            e.message
        );
        let e = err(&with(
            "[runtime]\ncommand = [\"node\", \"./provider.mjs\"]\n",
            "",
        ));
        assert!(e.message.contains("'runtime' is missing"), "{}", e.message);
    }

    #[test]
    fn syntax_errors_name_the_line() {
        let e = err(&with("version = \"0.1.0\"", "version = \"0.1.0"));
        assert_eq!(e.code, ErrorCode::InvalidManifest);
        assert!(e.message.contains("line 4"), "{}", e.message);
        let e = err(&with(
            "version = \"0.1.0\"",
            "version = \"0.1.0\"\nversion = \"2\"",
        ));
        assert!(e.message.contains("line 5"), "{}", e.message);
        assert!(e.message.contains("duplicate"), "{}", e.message);
    }

    #[test]
    fn protocol_mismatch_is_e8003() {
        let e = err(&with("protocol = \"EPP/1\"", "protocol = \"EPP/2\""));
        assert_eq!(e.code, ErrorCode::ProtocolMismatch);
        assert_eq!(
            e.to_string(),
            "[E8003] Provider 'opensandbox' speaks 'EPP/2', not EPP/1."
        );
        assert!(e.suggestion.contains("line 5"), "{}", e.suggestion);
    }

    #[test]
    fn network_entries() {
        for ok in [
            "*",
            "example.com",
            "api.example.com:443",
            "*:443",
            "*.example.com",
            "10.0.0.1:8080",
            "[::1]:9000",
            "localhost",
        ] {
            assert!(check_network(ok).is_ok(), "{ok}");
        }
        for bad in [
            "", "a b", "host:", "host:0", "http://x", "[::1", "[zz]", "-a.com", "a..b",
        ] {
            assert!(check_network(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn names() {
        assert!(is_valid_id("a") && is_valid_id("0abc-d") && is_valid_id(&"a".repeat(63)));
        assert!(
            !is_valid_id("")
                && !is_valid_id("-a")
                && !is_valid_id("A")
                && !is_valid_id(&"a".repeat(64))
        );
        assert!(
            is_valid_config_key("api_key")
                && !is_valid_config_key("_a")
                && !is_valid_config_key("a-b")
        );
        assert!(
            is_valid_env_name("_A1")
                && is_valid_env_name("API_KEY")
                && !is_valid_env_name("1A")
                && !is_valid_env_name("a")
        );
    }
}
