//! Feature names (docs/design.md#features), the feature each method needs (from
//! [`crate::catalogue`]), and their grouped display.

/// Every feature a provider may declare.
pub const ALL: &[&str] = &[
    "sandbox.lifecycle",
    "sandbox.timeout",
    "sandbox.pause",
    "exec.run",
    "exec.stream",
    "process.manage",
    "pty",
    "files.rw",
    "files.watch",
    "files.transfer",
    "code.interpret",
    "templates.read",
    "templates.build",
    "ports.url",
    "ports.domain",
    "storage.mount",
    "network.vpc",
    "sessions",
];

/// True for a known feature name.
pub fn is_known(f: &str) -> bool {
    ALL.contains(&f)
}

/// The features that gate no method of their own: how a method is served (`files.transfer`:
/// a provider's native upload and download) or options of other methods (`ports.domain`),
/// docs/design.md#features. (`storage.mount` gates `sandbox/diff`, `apply` and `discard`,
/// and `sandbox/create`'s `mounts`; `network.vpc` gates `sandbox/setNetwork` and a policy
/// as `sandbox/create`'s `network`.)
pub const NOT_GATING: &[&str] = &["files.transfer", "ports.domain"];

/// The feature a provider method needs (`None` for methods the broker serves itself), from
/// the catalogue ([`crate::catalogue`]). `has_pty` is whether the params ask for a pty
/// (`exec/start` with `pty`).
pub fn for_method(method: &str, has_pty: bool) -> Option<&'static str> {
    crate::catalogue::method(method)?.feature_for(has_pty)
}

/// The provider methods of the broker API (routed to a provider after gating), in the
/// catalogue's order ([`crate::catalogue::ROUTED`]).
pub const PROVIDER_METHODS: &[&str] = crate::catalogue::ROUTED;

/// Group dotted features for display: `sandbox(lifecycle,timeout) exec(run) pty`.
pub fn grouped(features: &[String]) -> String {
    let mut groups: Vec<(String, Vec<String>)> = Vec::new();
    for known in ALL {
        if !features.iter().any(|f| f == known) {
            continue;
        }
        match known.split_once('.') {
            Some((g, s)) => match groups.iter_mut().find(|(name, _)| name == g) {
                Some((_, subs)) => subs.push(s.to_owned()),
                None => groups.push((g.to_owned(), vec![s.to_owned()])),
            },
            None => groups.push((known.to_string(), vec![])),
        }
    }
    groups
        .into_iter()
        .map(|(g, subs)| {
            if subs.is_empty() {
                g
            } else {
                format!("{g}({})", subs.join(","))
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// Capabilities derived from features (the seed's open problem: never claim what the
/// provider does not declare).
pub fn capabilities(features: &[String]) -> Vec<&'static str> {
    let has = |f: &str| features.iter().any(|x| x == f);
    let mut caps = Vec::new();
    if has("code.interpret") {
        caps.push("code");
    }
    if has("files.rw") {
        caps.push("files");
    }
    if has("ports.url") {
        caps.push("ports");
    }
    if has("process.manage") {
        caps.push("processes");
    }
    if has("pty") {
        caps.push("pty");
    }
    if has("exec.run") || has("exec.stream") {
        caps.push("shell");
    }
    if has("templates.read") {
        caps.push("templates");
    }
    if has("files.watch") {
        caps.push("watch");
    }
    caps
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_provider_method_maps_to_a_known_feature() {
        for m in PROVIDER_METHODS {
            let f = for_method(m, false).unwrap_or_else(|| panic!("{m} has no feature"));
            assert!(is_known(f), "{m} -> {f}");
        }
        assert_eq!(for_method("exec/start", true), Some("pty"));
        assert_eq!(for_method("broker/ping", false), None);
    }

    #[test]
    fn grouping_matches_the_seed() {
        let f: Vec<String> = [
            "sandbox.lifecycle",
            "sandbox.timeout",
            "sandbox.pause",
            "exec.run",
            "exec.stream",
            "process.manage",
            "files.rw",
            "ports.url",
            "sessions",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        assert_eq!(
            grouped(&f),
            "sandbox(lifecycle,timeout,pause) exec(run,stream) process(manage) files(rw) ports(url) sessions"
        );
        assert_eq!(
            capabilities(&f),
            vec!["files", "ports", "processes", "shell"]
        );
    }
}
