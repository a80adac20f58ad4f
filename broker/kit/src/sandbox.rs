//! Tests of the provider itself and its sandboxes: features, description, lifecycle,
//! lifetimes, pause, sessions, gating, secrets, ports, capabilities, code, templates.

use super::client::{short, RpcErr};
use super::{ensure, now, parse_time, pass, Done, Outcome, T};
use abx_protocol::{features, ErrorCode};
use serde_json::{json, Value};
use std::time::Duration;

/// A command that prints its whole environment (twice over, to be sure).
const ENV_DUMP: &str = "env; cat /proc/self/environ 2>/dev/null | tr '\\0' '\\n'";

fn expires(v: &Value, what: &str) -> Result<f64, String> {
    let s = v["expiresAt"].as_str().unwrap_or_default();
    parse_time(s).ok_or_else(|| {
        format!(
            "{what}: expiresAt {:?} is not an RFC 3339 time",
            v["expiresAt"]
        )
    })
}

fn ids_of(list: &Value) -> Vec<String> {
    list["sandboxes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|s| s["id"].as_str().map(str::to_owned))
        .collect()
}

/// A call that a provider must refuse with a typed error: any known E-code except the
/// ones that mean "broken" (internal, bad reply, crash, timeout, not implemented).
fn typed_refusal(e: &RpcErr) -> bool {
    ErrorCode::from_abx(&e.abx).is_some() && !e.is(&["E9001", "E8009", "E8007", "E8008", "E1003"])
}

/// What a declared feature's method answering E1003 means.
fn not_implemented(feature: &str, method: &str, e: &RpcErr) -> String {
    format!(
        "the provider declares '{feature}' but {method} answered {e}: declared, not implemented"
    )
}

pub async fn declared_features_are_known(t: &T) -> Outcome {
    let c = t.client();
    let list = c.ok("provider/list", json!({})).await?;
    let entry = list["providers"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|p| p["id"] == t.id())
        .cloned()
        .ok_or_else(|| format!("provider/list does not list '{}'", t.id()))?;
    let declared: Vec<String> = entry["features"]
        .as_array()
        .ok_or("provider/list has no features array for it")?
        .iter()
        .map(|f| f.as_str().unwrap_or("<not a string>").to_owned())
        .collect();
    ensure!(
        !declared.is_empty(),
        "the provider declares no feature at all"
    );
    for f in &declared {
        ensure!(
            features::is_known(f),
            "declared feature '{f}' is not a known feature (known: {})",
            features::ALL.join(", ")
        );
    }
    let mut dedup = declared.clone();
    dedup.sort();
    dedup.dedup();
    ensure!(
        dedup.len() == declared.len(),
        "features are declared twice: {declared:?}"
    );
    let info = c.ok("provider/info", json!({"id": t.id()})).await?;
    ensure!(
        info["features"] == entry["features"],
        "provider/info features {} differ from provider/list's {}",
        info["features"],
        entry["features"]
    );
    // Options-only features ride on sandbox/create: declaring them still needs it.
    for f in ["storage.mount", "network.vpc", "ports.domain"] {
        if t.has(f) {
            let base = if f == "ports.domain" {
                "ports.url"
            } else {
                "sandbox.lifecycle"
            };
            ensure!(
                t.has(base),
                "'{f}' is declared without '{base}', which it extends"
            );
        }
    }
    pass()
}

pub async fn describe_never_exposes_secret_defaults(t: &T) -> Outcome {
    let c = t.client();
    let info = c.ok("provider/info", json!({"id": t.id()})).await?;
    for entry in info["config"].as_array().into_iter().flatten() {
        if entry["secret"] == true {
            ensure!(
                entry.get("default").is_none(),
                "provider/info shows a default for the secret key '{}'",
                entry["name"].as_str().unwrap_or("?")
            );
        }
    }
    let list = c.ok("provider/list", json!({})).await?;
    let texts = [info.to_string(), list.to_string()];
    for (key, value) in t.kit.secret_defaults.iter().chain(&t.kit.secrets) {
        if value.len() < 4 {
            continue;
        }
        for (what, text) in ["provider/info", "provider/list"].iter().zip(&texts) {
            ensure!(
                !text.contains(value.as_str()),
                "{what} contains the value of the secret key '{key}'"
            );
        }
    }
    pass()
}

pub async fn lifecycle(t: &T) -> Outcome {
    let c = t.client();
    let sb = t
        .create(json!({"metadata": {"kit": "test_lifecycle"}}))
        .await?;
    let i = &sb.info;
    ensure!(
        i["status"] == "running",
        "sandbox/create answered status {}, expected \"running\"",
        i["status"]
    );
    ensure!(
        i["provider"] == t.id(),
        "sandbox/create answered provider {}, expected {:?}",
        i["provider"],
        t.id()
    );
    ensure!(
        i["metadata"]["kit"] == "test_lifecycle",
        "sandbox/create did not return the metadata as given: {}",
        i["metadata"]
    );
    let exp = expires(i, "sandbox/create")?;
    let left = exp - now();
    ensure!(
        (60.0..=180.0).contains(&left),
        "sandbox/create with timeout 120 answered expiresAt {} ({left:.0} s from now)",
        i["expiresAt"]
    );
    let info = c.ok("sandbox/info", json!({"sandbox": sb.id})).await?;
    ensure!(
        info["id"] == sb.local.as_str(),
        "sandbox/info answered id {}, expected {:?}",
        info["id"],
        sb.local
    );
    ensure!(
        info["status"] == "running",
        "sandbox/info answered status {}",
        info["status"]
    );
    let list = c.ok("sandbox/list", json!({"provider": t.id()})).await?;
    ensure!(
        ids_of(&list).contains(&sb.local),
        "sandbox/list does not contain the new sandbox {}",
        sb.local
    );
    if t.has("sessions") {
        let con = c.ok("sandbox/connect", json!({"sandbox": sb.id})).await?;
        ensure!(
            con["expiresAt"] == i["expiresAt"],
            "sandbox/connect changed expiresAt from {} to {}: connecting must keep the lifetime",
            i["expiresAt"],
            con["expiresAt"]
        );
    }
    let k = c.ok("sandbox/kill", json!({"sandbox": sb.id})).await?;
    ensure!(
        k["killed"] == true,
        "sandbox/kill of a running sandbox answered {k}, expected killed: true"
    );
    c.expect_code(
        "sandbox/info",
        json!({"sandbox": sb.id}),
        &["E2009"],
        "sandbox/info after kill",
    )
    .await?;
    let list = c.ok("sandbox/list", json!({"provider": t.id()})).await?;
    ensure!(
        !ids_of(&list).contains(&sb.local),
        "sandbox/list still lists the killed sandbox"
    );
    pass()
}

pub async fn kill_is_idempotent(t: &T) -> Outcome {
    let c = t.client();
    let sb = t.create(json!({})).await?;
    let k = c.ok("sandbox/kill", json!({"sandbox": sb.id})).await?;
    ensure!(
        k["killed"] == true,
        "the first sandbox/kill answered {k}, expected killed: true"
    );
    let k2 = c
        .call("sandbox/kill", json!({"sandbox": sb.id}))
        .await
        .map_err(|e| {
            format!(
                "the second sandbox/kill of the same sandbox failed: {e}; \
                 killing must be idempotent"
            )
        })?;
    ensure!(
        k2["killed"] == false,
        "the second sandbox/kill answered {k2}, expected killed: false"
    );
    let never = format!("{}:kit-never-existed-0", t.id());
    c.call("sandbox/kill", json!({"sandbox": never}))
        .await
        .map_err(|e| {
            format!("sandbox/kill of an id that never existed failed: {e}; expected killed: false")
        })?;
    pass()
}

pub async fn set_timeout(t: &T) -> Outcome {
    let c = t.client();
    let sb = t.create(json!({})).await?;
    let r = c
        .ok(
            "sandbox/setTimeout",
            json!({"sandbox": sb.id, "timeout": 600}),
        )
        .await?;
    let left = expires(&r, "sandbox/setTimeout")? - now();
    ensure!(
        (540.0..=660.0).contains(&left),
        "after sandbox/setTimeout 600 expiresAt is {} ({left:.0} s from now)",
        r["expiresAt"]
    );
    let info = c.ok("sandbox/info", json!({"sandbox": sb.id})).await?;
    ensure!(
        info["expiresAt"] == r["expiresAt"],
        "sandbox/info answered expiresAt {} after setTimeout answered {}",
        info["expiresAt"],
        r["expiresAt"]
    );
    let r = c
        .ok(
            "sandbox/setTimeout",
            json!({"sandbox": sb.id, "timeout": 60}),
        )
        .await?;
    let left = expires(&r, "sandbox/setTimeout")? - now();
    ensure!(
        (30.0..=90.0).contains(&left),
        "sandbox/setTimeout 60 must shorten the lifetime; expiresAt is {} ({left:.0} s from now)",
        r["expiresAt"]
    );
    c.expect_code(
        "sandbox/setTimeout",
        json!({"sandbox": sb.id, "timeout": 0}),
        &["E2004", "E1004"],
        "sandbox/setTimeout 0",
    )
    .await?;
    let gone = format!("{}:kit-no-such-sandbox", t.id());
    c.expect_code(
        "sandbox/setTimeout",
        json!({"sandbox": gone, "timeout": 60}),
        &["E2009"],
        "sandbox/setTimeout of an unknown sandbox",
    )
    .await?;
    pass()
}

pub async fn pause_resume(t: &T) -> Outcome {
    let c = t.client();
    let sb = t.create(json!({})).await?;
    let p = match c.call("sandbox/pause", json!({"sandbox": sb.id})).await {
        Ok(v) => v,
        Err(e) if e.is(&["E1003"]) => {
            return Err(not_implemented("sandbox.pause", "sandbox/pause", &e))
        }
        Err(e) => return Err(format!("sandbox/pause failed: {e}")),
    };
    ensure!(
        p["status"] == "paused",
        "sandbox/pause answered status {}, expected \"paused\"",
        p["status"]
    );
    let info = c.ok("sandbox/info", json!({"sandbox": sb.id})).await?;
    ensure!(
        info["status"] == "paused",
        "sandbox/info of a paused sandbox answered status {}",
        info["status"]
    );
    if t.has("exec.run") {
        match c
            .call("exec/run", json!({"sandbox": sb.id, "command": "echo ran"}))
            .await
        {
            Ok(v) => {
                return Err(format!(
                    "exec/run in a paused sandbox ran: {}; expected E2002",
                    short(&v.to_string())
                ))
            }
            Err(e) => ensure!(
                typed_refusal(&e),
                "exec/run in a paused sandbox answered {e}; expected E2002"
            ),
        }
    }
    let r = c.ok("sandbox/resume", json!({"sandbox": sb.id})).await?;
    ensure!(
        r["status"] == "running",
        "sandbox/resume answered status {}, expected \"running\"",
        r["status"]
    );
    if t.has("exec.run") {
        let r = c
            .ok(
                "exec/run",
                json!({"sandbox": sb.id, "command": "echo alive"}),
            )
            .await?;
        ensure!(
            r["stdout"] == "alive\n",
            "exec/run after resume answered stdout {}",
            r["stdout"]
        );
    }
    pass()
}

pub async fn connect_keeps_lifetime(t: &T) -> Outcome {
    let c = t.client();
    let sb = t.create(json!({})).await?;
    // Past a second boundary: a provider that restarts the lifetime on connect shows it.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let con = c.ok("sandbox/connect", json!({"sandbox": sb.id})).await?;
    ensure!(
        con["id"] == sb.local.as_str(),
        "sandbox/connect answered id {}",
        con["id"]
    );
    ensure!(
        con["expiresAt"] == sb.info["expiresAt"],
        "sandbox/connect changed expiresAt from {} to {}: connecting must keep the lifetime",
        sb.info["expiresAt"],
        con["expiresAt"]
    );
    let info = c.ok("sandbox/info", json!({"sandbox": sb.id})).await?;
    ensure!(
        info["expiresAt"] == sb.info["expiresAt"],
        "after sandbox/connect, sandbox/info answers expiresAt {} (created with {})",
        info["expiresAt"],
        sb.info["expiresAt"]
    );
    let gone = format!("{}:kit-no-such-sandbox", t.id());
    c.expect_code(
        "sandbox/connect",
        json!({"sandbox": gone}),
        &["E2009"],
        "sandbox/connect to an unknown sandbox",
    )
    .await?;
    pass()
}

/// For each feature with a method: the method and params that need it.
fn probe(f: &str) -> Option<(&'static str, Value)> {
    Some(match f {
        "sandbox.timeout" => ("sandbox/setTimeout", json!({"timeout": 60})),
        "sandbox.pause" => ("sandbox/pause", json!({})),
        "sessions" => ("sandbox/connect", json!({})),
        "exec.run" => ("exec/run", json!({"command": "true"})),
        "exec.stream" => ("exec/start", json!({"command": "true"})),
        "pty" => (
            "exec/start",
            json!({"command": "true", "pty": {"cols": 80, "rows": 24}}),
        ),
        "process.manage" => ("process/list", json!({})),
        "files.rw" => ("files/read", json!({"path": "/workspace/kit.txt"})),
        "files.watch" => ("files/watch", json!({"path": "/workspace"})),
        "code.interpret" => ("code/run", json!({"language": "python", "code": "1"})),
        "templates.read" => ("templates/list", json!({})),
        "templates.build" => ("templates/build", json!({})),
        "ports.url" => ("ports/url", json!({"port": 8080})),
        _ => return None,
    })
}

pub async fn undeclared_feature_fails_with_e8004(t: &T) -> Outcome {
    let undeclared: Vec<&str> = features::ALL
        .iter()
        .copied()
        .filter(|f| !t.has(f) && probe(f).is_some())
        .collect();
    if undeclared.is_empty() {
        return Ok(Done::Skipped(
            "the provider declares every feature that has a method".into(),
        ));
    }
    let c = t.client();
    // With a real sandbox when there can be one: that is how clients call.
    let target = if t.has("sandbox.lifecycle") {
        let sb = t.create(json!({})).await?;
        json!({"sandbox": sb.id})
    } else {
        json!({"provider": t.id()})
    };
    for f in &undeclared {
        let (method, mut params) = probe(f).expect("probed");
        if let (Some(o), Some(x)) = (params.as_object_mut(), target.as_object()) {
            o.extend(x.clone());
        }
        let e = c
            .expect_code(
                method,
                params,
                &["E8004"],
                &format!("{method} (needs the undeclared '{f}')"),
            )
            .await?;
        let want = format!("Provider '{}' does not support '{f}'.", t.id());
        ensure!(
            e.message == want,
            "{method} answered E8004 with {:?}, expected {want:?}",
            e.message
        );
    }
    Ok(Done::Passed(Some(format!(
        "checked {}",
        undeclared.join(", ")
    ))))
}

pub async fn secret_options_are_redacted_from_errors(t: &T) -> Outcome {
    let secrets: Vec<&(String, String)> =
        t.kit.secrets.iter().filter(|(_, v)| v.len() >= 4).collect();
    let c = t.client();
    let mut errors: Vec<(String, RpcErr)> = Vec::new();
    let mut outputs: Vec<(String, String)> = Vec::new();
    let gone = format!("{}:kit-no-such-sandbox", t.id());
    let mut provoke = |what: &str, r: Result<Value, RpcErr>| match r {
        Err(e) => errors.push((what.to_owned(), e)),
        Ok(v) => {
            // Command output may be base64: look at the bytes, not the encoding.
            let mut text = v.to_string();
            for stream in ["stdout", "stderr"] {
                let bytes = super::client::decode(&v[stream], &v["encoding"]);
                text.push_str(&String::from_utf8_lossy(&bytes));
            }
            outputs.push((what.to_owned(), text))
        }
    };
    if t.has("sandbox.lifecycle") {
        provoke(
            "sandbox/info of an unknown sandbox",
            c.call("sandbox/info", json!({"sandbox": gone})).await,
        );
        let bad = t
            .create_raw(json!({"provider": t.id(), "timeout": -5}))
            .await;
        provoke("sandbox/create with timeout -5", bad);
        let sb = t.create(json!({})).await?;
        if t.has("files.rw") {
            provoke(
                "files/read of a missing file",
                c.call(
                    "files/read",
                    json!({"sandbox": sb.id, "path": "/workspace/kit-missing.txt"}),
                )
                .await,
            );
            provoke(
                "files/read outside the sandbox",
                c.call(
                    "files/read",
                    json!({"sandbox": sb.id, "path": "/workspace/../../etc/passwd"}),
                )
                .await,
            );
        }
        if t.has("exec.run") {
            provoke(
                "exec/run of a missing program",
                c.call(
                    "exec/run",
                    json!({"sandbox": sb.id, "argv": ["/no/such/kit-program"]}),
                )
                .await,
            );
            provoke(
                "the environment of a command",
                c.call("exec/run", json!({"sandbox": sb.id, "command": ENV_DUMP}))
                    .await,
            );
        }
        if t.has("sandbox.timeout") {
            provoke(
                "sandbox/setTimeout 0",
                c.call(
                    "sandbox/setTimeout",
                    json!({"sandbox": sb.id, "timeout": 0}),
                )
                .await,
            );
        }
    }
    if errors.is_empty() && outputs.is_empty() {
        return Ok(Done::Skipped(
            "provider does not declare sandbox.lifecycle: no error to provoke".into(),
        ));
    }
    for (key, value) in &secrets {
        for (what, e) in &errors {
            ensure!(
                !e.raw.to_string().contains(value.as_str()),
                "the error of {what} contains the value of the secret key '{key}'"
            );
        }
        for (what, out) in &outputs {
            let why = if what.contains("environment") {
                " (commands must never get the provider's secrets)"
            } else {
                ""
            };
            ensure!(
                !out.contains(value.as_str()),
                "{what} contains the value of the secret key '{key}'{why}"
            );
        }
    }
    let note = if secrets.is_empty() {
        format!(
            "no secret config value is set; {} errors checked",
            errors.len()
        )
    } else {
        format!(
            "{} secret value(s) checked against {} errors",
            secrets.len(),
            errors.len()
        )
    };
    Ok(Done::Passed(Some(note)))
}

pub async fn ports_url(t: &T) -> Outcome {
    let c = t.client();
    let sb = t.create(json!({})).await?;
    let r = c
        .ok("ports/url", json!({"sandbox": sb.id, "port": 8080}))
        .await?;
    let url = r["url"].as_str().unwrap_or_default();
    ensure!(
        url.contains("://"),
        "ports/url answered url {}, expected an absolute URL",
        r["url"]
    );
    ensure!(
        r.get("headers")
            .is_none_or(|h| h.is_object() || h.is_null()),
        "ports/url answered headers {}, expected an object",
        r["headers"]
    );
    for port in [0, 70000] {
        c.expect_code(
            "ports/url",
            json!({"sandbox": sb.id, "port": port}),
            &["E5002", "E1004"],
            &format!("ports/url of port {port}"),
        )
        .await?;
    }
    pass()
}

pub async fn capabilities_match_features(t: &T) -> Outcome {
    let c = t.client();
    let sb = t.create(json!({})).await?;
    let r = c
        .ok("sandbox/capabilities", json!({"sandbox": sb.id}))
        .await?;
    let mut got: Vec<String> = r["features"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|f| f.as_str().map(str::to_owned))
        .collect();
    let mut want = t.kit.features.clone();
    got.sort();
    want.sort();
    ensure!(
        got == want,
        "sandbox/capabilities features {got:?} differ from the declared {want:?}"
    );
    let caps = features::capabilities(&t.kit.features);
    ensure!(
        r["capabilities"] == json!(caps),
        "sandbox/capabilities answered {} but the declared features give {caps:?}",
        r["capabilities"]
    );
    pass()
}

pub async fn system_info(t: &T) -> Outcome {
    let c = t.client();
    let sb = t.create(json!({})).await?;
    match c
        .call("sandbox/systemInfo", json!({"sandbox": sb.id}))
        .await
    {
        Ok(v) => {
            ensure!(
                v.is_object(),
                "sandbox/systemInfo answered {v}, expected an object"
            );
            ensure!(
                v["os"].is_string(),
                "sandbox/systemInfo has no os: {}",
                short(&v.to_string())
            );
            pass()
        }
        Err(e) if e.is(&["E1003"]) => Ok(Done::Passed(Some(
            "systemInfo is not provided (E1003), which is allowed".into(),
        ))),
        Err(e) => Err(format!("sandbox/systemInfo failed: {e}")),
    }
}

pub async fn code_run(t: &T) -> Outcome {
    let c = t.client();
    let sb = match super::code::python_sandbox(t).await {
        Ok(sb) => sb,
        Err(skip) => return skip,
    };
    let r = match c
        .call(
            "code/run",
            json!({"sandbox": sb.id, "language": "python", "code": "print(6*7)"}),
        )
        .await
    {
        Ok(v) => v,
        Err(e) if e.is(&["E1003"]) => {
            return Err(not_implemented("code.interpret", "code/run", &e))
        }
        Err(e) => return Err(format!("code/run failed: {e}")),
    };
    ensure!(
        r["stdout"].as_str().unwrap_or_default().contains("42"),
        "code/run of print(6*7) answered stdout {}",
        r["stdout"]
    );
    ensure!(
        r["error"].is_null(),
        "code/run of print(6*7) answered error {}",
        r["error"]
    );
    pass()
}

pub async fn templates_list(t: &T) -> Outcome {
    let c = t.client();
    match c.call("templates/list", json!({"provider": t.id()})).await {
        Ok(v) => {
            ensure!(v.is_object() || v.is_array(), "templates/list answered {v}");
            pass()
        }
        Err(e) if e.is(&["E1003"]) => Err(not_implemented("templates.read", "templates/list", &e)),
        Err(e) => Err(format!("templates/list failed: {e}")),
    }
}

pub async fn templates_build_is_typed(t: &T) -> Outcome {
    let c = t.client();
    let dir = "/nonexistent/abx-kit-template";
    match c
        .call("templates/build", json!({"provider": t.id(), "path": dir}))
        .await
    {
        Ok(v) => Err(format!(
            "templates/build of a missing directory succeeded: {}",
            short(&v.to_string())
        )),
        Err(e) if e.is(&["E1003"]) => {
            Err(not_implemented("templates.build", "templates/build", &e))
        }
        Err(e) => {
            ensure!(
                typed_refusal(&e),
                "templates/build of a missing directory answered {e}; expected a typed error"
            );
            pass()
        }
    }
}
