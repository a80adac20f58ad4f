//! The Dockerfile parser: directives (`# escape=`, `# syntax=` ignored), line continuations,
//! comments, instructions with their `--flags`, the JSON exec form, `KEY=value` lists, and
//! variable expansion (`$VAR`, `${VAR}`, `${VAR:-default}`, `${VAR:+alt}`, `${VAR-d}`,
//! `${VAR+a}`), the rules of docker's frontend (written anew, not ported).
//!
//! Only the instructions [`Kind`] names are accepted: any other is an error naming it and
//! its line (E2012). Expansion happens when the build reaches an instruction (ARG and ENV
//! values change as it goes): [`expand`] and [`words`] take the variables in scope.

use std::collections::BTreeMap;

/// A command: the shell form (run by the stage's `SHELL`) or the exec form (an argv).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Cmd {
    /// `RUN make all`.
    Shell(String),
    /// `RUN ["make", "all"]`.
    Exec(Vec<String>),
}

/// One instruction, its words still unexpanded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Kind {
    /// `FROM [--platform=..] image [AS name]`.
    From {
        /// The image (or stage) named.
        image: String,
        /// `AS name`, lowercased.
        alias: Option<String>,
    },
    /// `RUN`.
    Run(Cmd),
    /// `COPY` / `ADD`.
    Copy {
        /// `ADD` (tar archives are extracted).
        add: bool,
        /// Sources (context paths or globs; a stage's paths with `from`).
        srcs: Vec<String>,
        /// The destination.
        dst: String,
        /// `--from=stage|index|image`.
        from: Option<String>,
        /// `--chown=user[:group]`.
        chown: Option<String>,
        /// `--chmod=octal`.
        chmod: Option<String>,
    },
    /// `ENV k=v ...` (or the old `ENV k v`).
    Env(Vec<(String, String)>),
    /// `ARG name[=default] ...`.
    Arg(Vec<(String, Option<String>)>),
    /// `WORKDIR path`.
    Workdir(String),
    /// `USER user[:group]`.
    User(String),
    /// `LABEL k=v ...`.
    Label(Vec<(String, String)>),
    /// `EXPOSE 80 443/tcp`.
    Expose(Vec<String>),
    /// `CMD`.
    CmdI(Cmd),
    /// `ENTRYPOINT`.
    Entrypoint(Cmd),
    /// `SHELL ["sh", "-c"]`.
    Shell(Vec<String>),
}

/// An instruction and where it is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Instr {
    /// Its first line (1-based).
    pub line: usize,
    /// `RUN make all`, as written on one line (what progress shows).
    pub text: String,
    /// What it is.
    pub kind: Kind,
}

/// A parse error: the line and what is wrong.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParseError {
    /// 1-based line.
    pub line: usize,
    /// What.
    pub detail: String,
}

fn err(line: usize, detail: impl Into<String>) -> ParseError {
    ParseError {
        line,
        detail: detail.into(),
    }
}

/// The instructions docker knows that this builder does not run.
const KNOWN_UNSUPPORTED: &[&str] = &[
    "VOLUME",
    "STOPSIGNAL",
    "HEALTHCHECK",
    "ONBUILD",
    "MAINTAINER",
];

/// Parse a Dockerfile.
pub fn parse(text: &str) -> Result<Vec<Instr>, ParseError> {
    let mut escape = '\\';
    let lines: Vec<&str> = text.lines().collect();
    let mut i = 0;
    // Parser directives: `# key=value` lines at the very top.
    while i < lines.len() {
        let l = lines[i].trim();
        let Some(rest) = l.strip_prefix('#') else {
            break;
        };
        let Some((k, v)) = rest.split_once('=') else {
            break;
        };
        let k = k.trim().to_ascii_lowercase();
        if k.contains(char::is_whitespace) || k.is_empty() {
            break;
        }
        match k.as_str() {
            "escape" => match v.trim() {
                "\\" => escape = '\\',
                "`" => escape = '`',
                _ => return Err(err(i + 1, "the escape directive takes \\ or `")),
            },
            "syntax" | "check" => {}
            _ => break,
        }
        i += 1;
    }
    let mut out = Vec::new();
    while i < lines.len() {
        let start = i;
        let first = lines[i];
        i += 1;
        let t = first.trim();
        if t.is_empty() || t.starts_with('#') {
            continue;
        }
        let mut logical = String::new();
        let mut cur = first.trim_start().to_owned();
        loop {
            let trimmed = cur.trim_end();
            if let Some(body) = trimmed.strip_suffix(escape) {
                logical.push_str(body);
                // The next non-comment, non-empty line continues it.
                let mut next = None;
                while i < lines.len() {
                    let l = lines[i];
                    i += 1;
                    let lt = l.trim();
                    if lt.starts_with('#') || lt.is_empty() {
                        continue;
                    }
                    next = Some(l.to_owned());
                    break;
                }
                match next {
                    Some(n) => cur = n,
                    None => break,
                }
            } else {
                logical.push_str(trimmed);
                break;
            }
        }
        out.push(instruction(start + 1, &logical, escape)?);
    }
    Ok(out)
}

fn instruction(line: usize, logical: &str, escape: char) -> Result<Instr, ParseError> {
    let logical = logical.trim();
    let (kw, rest) = match logical.find(char::is_whitespace) {
        Some(p) => (&logical[..p], logical[p..].trim_start()),
        None => (logical, ""),
    };
    let kw_up = kw.to_ascii_uppercase();
    let text = format!("{kw_up} {rest}").trim_end().to_owned();
    let need = |what: &str| -> Result<(), ParseError> {
        if rest.is_empty() {
            Err(err(line, format!("{kw_up} needs {what}")))
        } else {
            Ok(())
        }
    };
    let kind = match kw_up.as_str() {
        "FROM" => {
            let (flags, rest) = flags(line, rest, escape, &["platform"])?;
            let _ = flags;
            let w = split_ws(rest);
            match w.as_slice() {
                [img] => Kind::From {
                    image: img.clone(),
                    alias: None,
                },
                [img, as_, name] if as_.eq_ignore_ascii_case("as") => Kind::From {
                    image: img.clone(),
                    alias: Some(name.to_ascii_lowercase()),
                },
                _ => return Err(err(line, "FROM takes an image and an optional 'AS name'")),
            }
        }
        "RUN" => {
            let (_f, rest) = flags(line, rest, escape, &[])?;
            need("a command")?;
            Kind::Run(cmd(line, rest)?)
        }
        "CMD" => {
            need("a command")?;
            Kind::CmdI(cmd(line, rest)?)
        }
        "ENTRYPOINT" => {
            need("a command")?;
            Kind::Entrypoint(cmd(line, rest)?)
        }
        "SHELL" => match json_array(rest) {
            Some(v) if !v.is_empty() => Kind::Shell(v),
            _ => return Err(err(line, "SHELL takes a JSON array: SHELL [\"/bin/sh\", \"-c\"]")),
        },
        "COPY" | "ADD" => {
            let add = kw_up == "ADD";
            let allowed: &[&str] = if add {
                &["chown", "chmod"]
            } else {
                &["chown", "chmod", "from"]
            };
            let (f, rest) = flags(line, rest, escape, allowed)?;
            let mut w = match json_array(rest) {
                Some(v) => v,
                None => split_ws(rest),
            };
            if w.len() < 2 {
                return Err(err(line, format!("{kw_up} takes at least one source and a destination")));
            }
            let dst = w.pop().expect("two");
            Kind::Copy {
                add,
                srcs: w,
                dst,
                from: f.get("from").cloned(),
                chown: f.get("chown").cloned(),
                chmod: f.get("chmod").cloned(),
            }
        }
        "ENV" | "LABEL" => {
            need("KEY=value")?;
            let pairs = kv_pairs(line, rest, escape, kw_up == "ENV")?;
            if kw_up == "ENV" {
                Kind::Env(pairs)
            } else {
                Kind::Label(pairs)
            }
        }
        "ARG" => {
            need("a name")?;
            let mut v = Vec::new();
            for w in split_ws(rest) {
                match w.split_once('=') {
                    Some((k, d)) => v.push((k.to_owned(), Some(unquote(d, escape)))),
                    None => v.push((w, None)),
                }
            }
            Kind::Arg(v)
        }
        "WORKDIR" => {
            need("a path")?;
            Kind::Workdir(rest.to_owned())
        }
        "USER" => {
            need("a user")?;
            Kind::User(rest.to_owned())
        }
        "EXPOSE" => {
            need("a port")?;
            Kind::Expose(split_ws(rest))
        }
        k if KNOWN_UNSUPPORTED.contains(&k) => {
            return Err(err(
                line,
                format!("{k} is not supported by this builder (supported: FROM, RUN, COPY, ADD, ENV, ARG, WORKDIR, USER, LABEL, EXPOSE, CMD, ENTRYPOINT, SHELL)"),
            ))
        }
        _ => {
            return Err(err(
                line,
                format!("unknown instruction {kw:?} (supported: FROM, RUN, COPY, ADD, ENV, ARG, WORKDIR, USER, LABEL, EXPOSE, CMD, ENTRYPOINT, SHELL)"),
            ))
        }
    };
    Ok(Instr { line, text, kind })
}

/// Leading `--name=value` flags (only `allowed` ones).
fn flags<'a>(
    line: usize,
    mut rest: &'a str,
    escape: char,
    allowed: &[&str],
) -> Result<(BTreeMap<String, String>, &'a str), ParseError> {
    let mut out = BTreeMap::new();
    while let Some(f) = rest.strip_prefix("--") {
        let end = f.find(char::is_whitespace).unwrap_or(f.len());
        let (name, val) = match f[..end].split_once('=') {
            Some((n, v)) => (n, v),
            None => (&f[..end], ""),
        };
        if !allowed.contains(&name) {
            return Err(err(
                line,
                format!("the flag --{name} is not supported here"),
            ));
        }
        out.insert(name.to_owned(), unquote(val, escape));
        rest = f[end..].trim_start();
    }
    Ok((out, rest))
}

fn cmd(line: usize, rest: &str) -> Result<Cmd, ParseError> {
    if rest.trim_start().starts_with('[') {
        if let Some(v) = json_array(rest) {
            if v.is_empty() {
                return Err(err(line, "an empty command"));
            }
            return Ok(Cmd::Exec(v));
        }
    }
    Ok(Cmd::Shell(rest.to_owned()))
}

/// A JSON array of strings, or None (then the shell form applies, as docker does).
pub fn json_array(s: &str) -> Option<Vec<String>> {
    let s = s.trim();
    if !s.starts_with('[') {
        return None;
    }
    serde_json::from_str::<Vec<String>>(s).ok()
}

/// Split on whitespace (quotes kept; they are dealt with at expansion).
fn split_ws(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut q: Option<char> = None;
    let mut esc = false;
    for c in s.chars() {
        if esc {
            cur.push(c);
            esc = false;
            continue;
        }
        match (q, c) {
            (_, '\\') if q != Some('\'') => {
                cur.push(c);
                esc = true;
            }
            (None, '"' | '\'') => {
                q = Some(c);
                cur.push(c);
            }
            (Some(x), c) if x == c => {
                q = None;
                cur.push(c);
            }
            (None, c) if c.is_whitespace() => {
                if !cur.is_empty() {
                    out.push(std::mem::take(&mut cur));
                }
            }
            _ => cur.push(c),
        }
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
}

fn unquote(s: &str, escape: char) -> String {
    words(s, &BTreeMap::new(), escape, false)
        .map(|w| w.join(" "))
        .unwrap_or_else(|_| s.to_owned())
}

fn kv_pairs(
    line: usize,
    rest: &str,
    escape: char,
    legacy: bool,
) -> Result<Vec<(String, String)>, ParseError> {
    let w = split_ws(rest);
    if legacy && !w[0].contains('=') {
        // `ENV key value with spaces`.
        let (k, v) = match rest.find(char::is_whitespace) {
            Some(p) => (&rest[..p], rest[p..].trim()),
            None => return Err(err(line, "ENV needs a value: ENV KEY=value")),
        };
        return Ok(vec![(k.to_owned(), v.to_owned())]);
    }
    let mut out = Vec::new();
    for x in w {
        let Some((k, v)) = x.split_once('=') else {
            return Err(err(line, format!("{x:?} is not KEY=value")));
        };
        if k.is_empty() {
            return Err(err(line, "an empty key"));
        }
        out.push((unquote(k, escape), v.to_owned()));
    }
    Ok(out)
}

/// Expand variables in `s` and split it into words (quotes removed; `'...'` is literal,
/// `"..."` expands, the escape character takes the next one literally). With `expand`
/// false, only quotes and escapes are dealt with.
pub fn words(
    s: &str,
    vars: &BTreeMap<String, String>,
    escape: char,
    expand: bool,
) -> Result<Vec<String>, String> {
    let cs: Vec<char> = s.chars().collect();
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut started = false;
    let mut i = 0;
    let mut q: Option<char> = None;
    while i < cs.len() {
        let c = cs[i];
        if c == escape && q != Some('\'') && i + 1 < cs.len() {
            let n = cs[i + 1];
            if q == Some('"') && !matches!(n, '"' | '$') && n != escape {
                cur.push(c);
            }
            cur.push(n);
            started = true;
            i += 2;
            continue;
        }
        match (q, c) {
            (None, '\'' | '"') => {
                q = Some(c);
                started = true;
                i += 1;
            }
            (Some(x), c) if x == c => {
                q = None;
                i += 1;
            }
            (q, '$') if expand && q != Some('\'') => {
                let (v, n) = var(&cs[i..], vars, escape)?;
                cur.push_str(&v);
                started = true;
                i += n;
            }
            (None, c) if c.is_whitespace() => {
                if started || !cur.is_empty() {
                    out.push(std::mem::take(&mut cur));
                    started = false;
                }
                i += 1;
            }
            _ => {
                cur.push(c);
                started = true;
                i += 1;
            }
        }
    }
    if q.is_some() {
        return Err("an unclosed quote".into());
    }
    if started || !cur.is_empty() {
        out.push(cur);
    }
    Ok(out)
}

/// Expand variables in `s`, keeping it one string (quotes removed).
pub fn expand(s: &str, vars: &BTreeMap<String, String>, escape: char) -> Result<String, String> {
    Ok(words(s, vars, escape, true)?.join(" "))
}

/// One `$...` at the start of `cs`: its value and how many chars it took.
fn var(
    cs: &[char],
    vars: &BTreeMap<String, String>,
    escape: char,
) -> Result<(String, usize), String> {
    let name_char = |c: char| c.is_ascii_alphanumeric() || c == '_';
    if cs.len() < 2 {
        return Ok(("$".into(), 1));
    }
    if cs[1] == '{' {
        let close = {
            let mut depth = 0;
            let mut at = None;
            for (k, &c) in cs.iter().enumerate().skip(1) {
                match c {
                    '{' => depth += 1,
                    '}' => {
                        depth -= 1;
                        if depth == 0 {
                            at = Some(k);
                            break;
                        }
                    }
                    _ => {}
                }
            }
            at.ok_or("an unclosed ${")?
        };
        let inner: String = cs[2..close].iter().collect();
        let n = inner.find(|c: char| !name_char(c)).unwrap_or(inner.len());
        let name = &inner[..n];
        if name.is_empty() {
            return Err(format!("a bad variable ${{{inner}}}"));
        }
        let op = &inner[n..];
        let val = vars.get(name);
        let v = if op.is_empty() {
            val.cloned().unwrap_or_default()
        } else {
            let (colon, rest) = match op.strip_prefix(':') {
                Some(r) => (true, r),
                None => (false, op),
            };
            let set = match val {
                Some(v) => !(colon && v.is_empty()),
                None => false,
            };
            let word = || expand(&rest[1..], vars, escape);
            match rest.chars().next() {
                Some('-') => {
                    if set {
                        val.cloned().unwrap_or_default()
                    } else {
                        word()?
                    }
                }
                Some('+') => {
                    if set {
                        word()?
                    } else {
                        String::new()
                    }
                }
                _ => return Err(format!("an unsupported variable form ${{{inner}}}")),
            }
        };
        return Ok((v, close + 1));
    }
    let n = cs[1..].iter().take_while(|&&c| name_char(c)).count();
    if n == 0 {
        return Ok(("$".into(), 1));
    }
    let name: String = cs[1..=n].iter().collect();
    Ok((vars.get(&name).cloned().unwrap_or_default(), n + 1))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(kv: &[(&str, &str)]) -> BTreeMap<String, String> {
        kv.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn continuations_comments_and_forms() {
        let d = "# syntax=docker/dockerfile:1\nARG BASE=busybox\nFROM ${BASE} AS build\n# a comment\nRUN echo a \\\n  # inside\n  && echo b\nRUN [\"sh\", \"-c\", \"echo x\"]\nCOPY --chown=1:2 --chmod=755 a b /dst/\nENV A=1 B=\"two words\"\nENV OLD some value\nLABEL x=y\nEXPOSE 80 443/tcp\nCMD [\"sh\"]\nENTRYPOINT echo\nSHELL [\"/bin/sh\", \"-ec\"]\nUSER 1000:1000\nWORKDIR /app\n";
        let v = parse(d).unwrap();
        assert_eq!(v.len(), 14);
        assert_eq!(
            v[1].kind,
            Kind::From {
                image: "${BASE}".into(),
                alias: Some("build".into())
            }
        );
        assert_eq!(
            v[2].kind,
            Kind::Run(Cmd::Shell("echo a   && echo b".into()))
        );
        assert_eq!(v[2].line, 5);
        assert_eq!(
            v[3].kind,
            Kind::Run(Cmd::Exec(vec!["sh".into(), "-c".into(), "echo x".into()]))
        );
        match &v[4].kind {
            Kind::Copy {
                srcs,
                dst,
                chown,
                chmod,
                ..
            } => {
                assert_eq!(srcs, &["a", "b"]);
                assert_eq!(dst, "/dst/");
                assert_eq!(chown.as_deref(), Some("1:2"));
                assert_eq!(chmod.as_deref(), Some("755"));
            }
            k => panic!("{k:?}"),
        }
        assert_eq!(
            v[6].kind,
            Kind::Env(vec![("OLD".into(), "some value".into())])
        );
    }

    #[test]
    fn unsupported_instructions_name_the_line() {
        let e = parse("FROM scratch\n\nHEALTHCHECK CMD true\n").unwrap_err();
        assert_eq!(e.line, 3);
        assert!(e.detail.contains("HEALTHCHECK"), "{}", e.detail);
        let e = parse("FROM scratch\nFROB x\n").unwrap_err();
        assert_eq!(e.line, 2);
        assert!(e.detail.contains("FROB"));
    }

    #[test]
    fn escape_directive() {
        let v = parse("# escape=`\nFROM scratch\nRUN a `\n b\n").unwrap();
        assert_eq!(v[1].kind, Kind::Run(Cmd::Shell("a  b".into())));
    }

    #[test]
    fn expansion() {
        let v = vars(&[("A", "x"), ("E", "")]);
        assert_eq!(expand("$A/${A}y", &v, '\\').unwrap(), "x/xy");
        assert_eq!(expand("${B:-def}", &v, '\\').unwrap(), "def");
        assert_eq!(expand("${E:-def}", &v, '\\').unwrap(), "def");
        assert_eq!(expand("${E-def}", &v, '\\').unwrap(), "");
        assert_eq!(expand("${A:+alt}", &v, '\\').unwrap(), "alt");
        assert_eq!(expand("${B:+alt}", &v, '\\').unwrap(), "");
        assert_eq!(expand("'$A' \\$A", &v, '\\').unwrap(), "$A $A");
        assert_eq!(
            words("\"two $A\" one", &v, '\\', true).unwrap(),
            vec!["two x", "one"]
        );
        assert!(expand("${A", &v, '\\').is_err());
    }
}
