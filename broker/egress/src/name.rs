//! Host names as the policy and the proxy compare them: ASCII lower-case, one trailing dot
//! stripped, internationalized names left as given (punycode, `xn--...`), and anything that is
//! not a plausible DNS name refused. Std only (the fuzz crate compiles this file in).

/// The longest name (RFC 1035: 253 bytes written without the trailing dot).
pub const MAX_NAME: usize = 253;

/// The longest label.
pub const MAX_LABEL: usize = 63;

/// The name `raw` as it is compared: lower-case, without a trailing dot. `Err` says why it is
/// not a valid host name (in words a user can act on).
///
/// Labels are letters, digits, `-` (not first or last) and `_` (seen in real host names);
/// the last label is not all digits (`1.2.3` is an address in some resolvers' eyes, never a
/// name: write an IP address in full).
pub fn normalize(raw: &str) -> Result<String, &'static str> {
    let s = raw.strip_suffix('.').unwrap_or(raw);
    if s.is_empty() {
        return Err("an empty host name");
    }
    if s.len() > MAX_NAME {
        return Err("a host name longer than 253 bytes");
    }
    if !s.is_ascii() {
        return Err("not ASCII: write an internationalized name in its punycode form (xn--...)");
    }
    let mut last = "";
    for label in s.split('.') {
        if label.is_empty() {
            return Err("an empty label (a leading dot, or two dots in a row)");
        }
        if label.len() > MAX_LABEL {
            return Err("a label longer than 63 bytes");
        }
        if !label
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        {
            return Err("a character other than letters, digits, '-', '_' and '.'");
        }
        if label.starts_with('-') || label.ends_with('-') {
            return Err("a label that starts or ends with '-'");
        }
        last = label;
    }
    if last.bytes().all(|b| b.is_ascii_digit()) {
        return Err("an all-numeric last label (write an IP address in full)");
    }
    Ok(s.to_ascii_lowercase())
}

/// Whether `name` (normalized) is `localhost` or beneath it (RFC 6761: always loopback).
pub fn is_localhost(name: &str) -> bool {
    name == "localhost" || name.ends_with(".localhost")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_normalized_or_refused() {
        for (raw, want) in [
            ("Example.COM", Some("example.com")),
            ("example.com.", Some("example.com")),
            ("xn--bcher-kva.example", Some("xn--bcher-kva.example")),
            ("_acme.example", Some("_acme.example")),
            ("a-b.example", Some("a-b.example")),
            ("host", Some("host")),
            ("example.com..", None),
            (".example.com", None),
            ("", None),
            (".", None),
            ("bücher.example", None),
            ("-a.example", None),
            ("a-.example", None),
            ("a b.example", None),
            ("a/b", None),
            ("1.2.3", None),
            ("10.0.0.1", None),
        ] {
            assert_eq!(normalize(raw).ok().as_deref(), want, "{raw}");
        }
        let long = format!("{}.example", "a".repeat(64));
        assert!(normalize(&long).is_err());
        let max = [
            "a".repeat(63),
            "b".repeat(63),
            "c".repeat(63),
            "d".repeat(61),
        ]
        .join(".");
        assert_eq!(max.len(), 253);
        assert!(normalize(&max).is_ok());
        assert!(normalize(&format!("{max}.")).is_ok());
        assert!(normalize(&format!("{max}e")).is_err());
    }
}
