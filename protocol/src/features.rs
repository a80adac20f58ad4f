//! Feature names (DESIGN §5), the feature each method needs, and their grouped display.

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

/// The feature a provider method needs (`None` for methods the broker serves itself).
/// `has_pty` is whether the params ask for a pty (`exec/start` with `pty`).
pub fn for_method(method: &str, has_pty: bool) -> Option<&'static str> {
    Some(match method {
        "sandbox/create"
        | "sandbox/info"
        | "sandbox/list"
        | "sandbox/kill"
        | "sandbox/capabilities"
        | "sandbox/systemInfo" => "sandbox.lifecycle",
        "sandbox/setTimeout" => "sandbox.timeout",
        "sandbox/pause" | "sandbox/resume" => "sandbox.pause",
        "sandbox/connect" => "sessions",
        "exec/run" => "exec.run",
        "exec/start" if has_pty => "pty",
        "exec/start" | "exec/write" | "exec/kill" | "exec/attach" => "exec.stream",
        "exec/resize" => "pty",
        "process/list" | "process/kill" => "process.manage",
        "files/read" | "files/write" | "files/list" | "files/stat" | "files/mkdir"
        | "files/remove" | "files/rename" | "files/upload" | "files/download" => "files.rw",
        "files/watch" | "files/unwatch" => "files.watch",
        "ports/url" => "ports.url",
        "code/run"
        | "code/createContext"
        | "code/listContexts"
        | "code/restartContext"
        | "code/removeContext" => "code.interpret",
        "commands/run" | "templates/list" | "templates/init" | "templates/pull"
        | "templates/remove" | "templates/import" => "templates.read",
        "templates/build" => "templates.build",
        _ => return None,
    })
}

/// The provider methods of the broker API (routed to a provider after gating).
pub const PROVIDER_METHODS: &[&str] = &[
    "sandbox/create",
    "sandbox/info",
    "sandbox/connect",
    "sandbox/list",
    "sandbox/kill",
    "sandbox/setTimeout",
    "sandbox/pause",
    "sandbox/resume",
    "sandbox/capabilities",
    "sandbox/systemInfo",
    "exec/run",
    "exec/start",
    "exec/write",
    "exec/resize",
    "exec/kill",
    "exec/attach",
    "process/list",
    "process/kill",
    "files/read",
    "files/write",
    "files/list",
    "files/stat",
    "files/mkdir",
    "files/remove",
    "files/rename",
    "files/upload",
    "files/download",
    "files/watch",
    "files/unwatch",
    "ports/url",
    "code/run",
    "code/createContext",
    "code/listContexts",
    "code/restartContext",
    "code/removeContext",
    "commands/run",
    "templates/list",
    "templates/init",
    "templates/build",
    "templates/pull",
    "templates/remove",
    "templates/import",
];

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
