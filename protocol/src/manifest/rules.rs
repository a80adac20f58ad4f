//! The manifest's rules of shape: provider ids, configuration key names, environment
//! variable names, bare TOML keys, runtime arguments (a path must stay inside the plugin)
//! and `[security] network` entries. Pure functions, shared by the parser and the model.

pub(super) fn is_bare_key(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 64
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

pub(super) fn is_id(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && (b[0].is_ascii_lowercase() || b[0].is_ascii_digit())
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
}

/// `^[a-z0-9][a-z0-9-]{0,62}$`: a valid provider id.
pub fn is_valid_id(s: &str) -> bool {
    is_id(s)
}

/// `^[a-z][a-z0-9_]*$`: a valid configuration key name.
pub fn is_valid_config_key(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b[0].is_ascii_lowercase()
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'_')
}

/// `^[A-Z_][A-Z0-9_]*$`: a valid environment variable name.
pub fn is_valid_env_name(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && (b[0].is_ascii_uppercase() || b[0] == b'_')
        && b.iter()
            .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || *c == b'_')
}

pub(super) enum ArgKind {
    /// Not a path: a program name looked up in PATH, or an argument.
    Plain,
    /// A path inside the root (normalized, relative).
    Inside(String),
    /// Absolute.
    Absolute,
    /// Leaves the root.
    Escapes,
    /// Names the root itself.
    Root,
}

pub(super) fn classify_arg(index: usize, arg: &str) -> ArgKind {
    let is_path = arg.starts_with("./")
        || arg.starts_with("../")
        || arg == "."
        || arg == ".."
        || arg.starts_with('/')
        || (index == 0 && arg.contains('/'));
    if !is_path {
        return ArgKind::Plain;
    }
    if arg.starts_with('/') {
        return ArgKind::Absolute;
    }
    let mut parts: Vec<&str> = Vec::new();
    for c in arg.split('/') {
        match c {
            "" | "." => {}
            ".." => {
                if parts.pop().is_none() {
                    return ArgKind::Escapes;
                }
            }
            c => parts.push(c),
        }
    }
    if parts.is_empty() {
        ArgKind::Root
    } else {
        ArgKind::Inside(parts.join("/"))
    }
}

pub(super) fn check_network(entry: &str) -> Result<(), &'static str> {
    if entry == "*" {
        return Ok(());
    }
    let (host, port) = if let Some(rest) = entry.strip_prefix('[') {
        let close = rest
            .find(']')
            .ok_or("an IPv6 address needs a closing ']'")?;
        let host = &rest[..close];
        if host.is_empty()
            || !host
                .bytes()
                .all(|b| b.is_ascii_hexdigit() || b == b':' || b == b'.')
        {
            return Err("is not a valid IPv6 address");
        }
        let tail = &rest[close + 1..];
        let port = if tail.is_empty() {
            None
        } else {
            Some(tail.strip_prefix(':').ok_or("expected ':port' after ']'")?)
        };
        (None, port)
    } else {
        match entry.split_once(':') {
            Some((h, p)) => (Some(h), Some(p)),
            None => (Some(entry), None),
        }
    };
    if let Some(p) = port {
        match p.parse::<u32>() {
            Ok(n) if (1..=65535).contains(&n) && !p.starts_with('+') => {}
            _ => return Err("has an invalid port (1 to 65535)"),
        }
    }
    if let Some(h) = host {
        let body = h.strip_prefix("*.").unwrap_or(h);
        let ok = h == "*"
            || (!body.is_empty()
                && body.len() <= 253
                && body.split('.').all(|label| {
                    !label.is_empty()
                        && label.len() <= 63
                        && !label.starts_with('-')
                        && !label.ends_with('-')
                        && label
                            .bytes()
                            .all(|b| b.is_ascii_alphanumeric() || b == b'-')
                }));
        if !ok {
            return Err("is not a host name, IP address, 'host:port', '*:port' or '*'");
        }
    }
    Ok(())
}
