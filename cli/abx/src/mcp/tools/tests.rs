//! Unit tests of the tools: capture, schemas, results.

use super::exec::*;
use super::schema::*;
use super::simple::*;
use super::types::*;
use super::*;
use schemars::JsonSchema;
use serde::Serialize;

#[test]
fn capture_keeps_head_and_tail() {
    let mut c = Capture::default();
    c.push("hello ");
    c.push("world");
    assert_eq!(c.text(), "hello world");
    let mut c = Capture::default();
    let big = "é".repeat(HEAD + TAIL); // 2 bytes each
    c.push(&big);
    assert!(c.omitted > 0);
    assert!(c.head.len() <= HEAD && c.tail.len() <= TAIL);
    assert!(c.text().contains("bytes left out"));
    // Order is kept when the head ends inside a character.
    let mut c = Capture::default();
    c.push(&"a".repeat(HEAD - 1));
    c.push("é");
    c.push("b");
    assert_eq!(c.text(), format!("{}éb", "a".repeat(HEAD - 1)));
}

/// `v` without what schemars adds that says nothing new to an agent: integer `format`s
/// and the `minimum: 0` of unsigned integers; `required` sorted.
fn essential(mut v: Value) -> Value {
    if let Some(o) = v.as_object_mut() {
        if o.get("format")
            .and_then(Value::as_str)
            .is_some_and(|f| f.starts_with("uint") || f == "double")
        {
            o.remove("format");
            if o.get("minimum") == Some(&json!(0)) {
                o.remove("minimum");
            }
        }
        if let Some(Value::Array(r)) = o.get_mut("required") {
            r.sort_by_key(|x| x.to_string());
        }
        for x in o.values_mut() {
            *x = essential(x.take());
        }
    }
    v
}

/// The input schemas agents see are generated from the argument types, and say what the
/// hand-written ones said (names, types, bounds, descriptions, required, closed). After a
/// deliberate change, `ABX_UPDATE_MCP_SCHEMAS=1 cargo test -p abx-cli input_schemas`
/// rewrites the fixture's entries that changed (and adds new tools'), then fails once:
/// review the fixture's diff.
#[test]
fn input_schemas_are_generated_and_unchanged_for_agents() {
    let want: Value = serde_json::from_str(include_str!(
        "../../../tests/fixtures/mcp_input_schemas.json"
    ))
    .expect("fixture");
    if std::env::var_os("ABX_UPDATE_MCP_SCHEMAS").is_some() {
        let mut next = want.as_object().expect("object").clone();
        next.retain(|k, _| TOOLS.iter().any(|d| d.name == k));
        let mut changed = false;
        for d in TOOLS {
            let have = (d.input)();
            if next.get(d.name).map(|w| essential(w.clone())) != Some(essential(have.clone())) {
                next.insert(d.name.to_owned(), have);
                changed = true;
            }
        }
        if changed || next.len() != want.as_object().map_or(0, |w| w.len()) {
            let mut buf = Vec::new();
            let fmt = serde_json::ser::PrettyFormatter::with_indent(b" ");
            let mut ser = serde_json::Serializer::with_formatter(&mut buf, fmt);
            Value::Object(next).serialize(&mut ser).expect("serialize");
            let path = concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/tests/fixtures/mcp_input_schemas.json"
            );
            std::fs::write(path, buf).expect("write the fixture");
            panic!("{path} rewritten: review its diff and run the test again");
        }
    }
    let want = want.as_object().expect("object");
    assert_eq!(want.len(), TOOLS.len());
    for d in TOOLS {
        let have = essential((d.input)());
        assert_eq!(&have, &essential(want[d.name].clone()), "{}", d.name);
    }
}

/// Every argument of a tool reaches the broker as a member of the method's params
/// (the API type's schema has it), except those the tool renames or fixes.
#[test]
fn every_tool_argument_is_a_member_of_the_methods_params() {
    fn api_props<T: JsonSchema>() -> Vec<String> {
        let s = input_schema::<T>();
        s["properties"]
            .as_object()
            .expect("properties")
            .keys()
            .cloned()
            .collect()
    }
    // tool, method's params properties, renames (argument → member).
    type Renames = &'static [(&'static str, &'static str)];
    let cases: Vec<(&str, Vec<String>, Renames)> = vec![
        (
            "sandbox_create",
            api_props::<api::SandboxCreateParams>(),
            &[],
        ),
        ("sandbox_list", api_props::<api::SandboxListParams>(), &[]),
        ("sandbox_diff", api_props::<api::DiffParams>(), &[]),
        ("sandbox_apply", api_props::<api::ApplyParams>(), &[]),
        ("sandbox_discard", api_props::<api::DiscardParams>(), &[]),
        ("sandbox_log", api_props::<api::LogParams>(), &[]),
        ("sandbox_info", api_props::<api::SandboxParams>(), &[]),
        ("sandbox_kill", api_props::<api::SandboxParams>(), &[]),
        (
            "sandbox_set_timeout",
            api_props::<api::SetTimeoutParams>(),
            &[],
        ),
        (
            "sandbox_set_network",
            api_props::<api::SetNetworkParams>(),
            &[],
        ),
        ("exec", api_props::<api::ExecStartParams>(), &[]),
        ("run_code", api_props::<api::CodeRunParams>(), &[]),
        (
            "code_context_create",
            api_props::<api::CodeCreateContextParams>(),
            &[],
        ),
        ("code_context_list", api_props::<api::SandboxParams>(), &[]),
        (
            "code_context_restart",
            api_props::<api::CodeContextParams>(),
            &[],
        ),
        (
            "code_context_remove",
            api_props::<api::CodeContextParams>(),
            &[],
        ),
        ("files_read", api_props::<api::FilesReadParams>(), &[]),
        (
            "files_write",
            api_props::<api::FilesWriteParams>(),
            &[("content", "data")],
        ),
        ("files_list", api_props::<api::FilesListParams>(), &[]),
        ("ports_url", api_props::<api::PortParams>(), &[]),
        ("provider_list", api_props::<api::NoParams>(), &[]),
    ];
    assert_eq!(cases.len(), TOOLS.len());
    for (tool, members, renames) in cases {
        let d = TOOLS.iter().find(|d| d.name == tool).expect(tool);
        let input = (d.input)();
        for arg in input["properties"].as_object().expect("properties").keys() {
            let member = renames
                .iter()
                .find(|(a, _)| a == arg)
                .map_or(arg.as_str(), |(_, m)| m);
            assert!(
                members.iter().any(|m| m == member),
                "{tool}: {arg} is not a param"
            );
        }
    }
}

/// The conversions carry every argument into the request (and what the tool fixes).
#[test]
fn tool_arguments_convert_into_the_requests() {
    let a: ExecArgs = serde_json::from_value(
        json!({"sandbox": "s", "command": "ls", "cwd": "/tmp", "env": {"A": "1"}, "timeout": 2.5}),
    )
    .expect("args");
    assert_eq!(
        to_params(&api::ExecStartParams::from(a)),
        json!({"sandbox": "s", "command": "ls", "cwd": "/tmp", "env": {"A": "1"}, "timeout": 2.5, "stdin": ""})
    );
    let a: CreateArgs =
        serde_json::from_value(json!({"timeout": 60, "metadata": {"k": "v"}})).expect("args");
    assert_eq!(
        to_params(&api::SandboxCreateParams::from(a)),
        json!({"timeout": 60, "metadata": {"k": "v"}})
    );
    // Mounts: a relative source is taken from abx mcp's directory.
    let cwd = std::env::current_dir().unwrap();
    let a: CreateArgs = serde_json::from_value(json!({"mounts": [
        {"source": "/srv/p", "target": "/workspace/p", "mode": "ro"},
        {"source": "sub"},
    ]}))
    .expect("args");
    assert_eq!(
        to_params(&api::SandboxCreateParams::from(a)),
        json!({"mounts": [
            {"source": "/srv/p", "target": "/workspace/p", "mode": "ro"},
            {"source": cwd.join("sub").to_string_lossy()},
        ]})
    );
    assert!(serde_json::from_value::<CreateArgs>(
        json!({"mounts": [{"source": ".", "mode": "rwx"}]})
    )
    .is_err());
    let a: ApplyArgs = serde_json::from_value(
        json!({"sandbox": "s", "paths": ["/workspace/a"], "dryRun": true, "force": false}),
    )
    .expect("args");
    assert_eq!(
        to_params(&api::ApplyParams::from(a)),
        json!({"sandbox": "s", "paths": ["/workspace/a"], "dryRun": true, "force": false})
    );
    let a: WriteArgs =
        serde_json::from_value(json!({"sandbox": "s", "path": "p", "content": "x"})).expect("args");
    assert_eq!(
        to_params(&api::FilesWriteParams::from(a)),
        json!({"sandbox": "s", "path": "p", "data": "x", "append": false})
    );
    let a: CreateArgs =
        serde_json::from_value(json!({"limits": {"memory": "512M", "cpus": 1.5, "pids": 64}}))
            .expect("args");
    assert_eq!(
        to_params(&api::SandboxCreateParams::from(a)),
        json!({"limits": {"memory": "512M", "cpus": 1.5, "pids": 64}})
    );
    let a: CreateContextArgs = serde_json::from_value(
        json!({"sandbox": "s", "language": "python", "cwd": "/tmp", "interpreter": "/v/bin/python", "env": {"A": "1"}}),
    )
    .expect("args");
    assert_eq!(
        to_params(&api::CodeCreateContextParams::from(a)),
        json!({"sandbox": "s", "language": "python", "cwd": "/tmp", "interpreter": "/v/bin/python", "env": {"A": "1"}})
    );
    let a: ContextArgs =
        serde_json::from_value(json!({"sandbox": "s", "context": "c1"})).expect("args");
    assert_eq!(
        to_params(&api::CodeContextParams::from(a)),
        json!({"sandbox": "s", "context": "c1"})
    );
    // Unknown arguments are refused (the schemas are closed).
    assert!(
        serde_json::from_value::<PortArgs>(json!({"sandbox": "s", "port": 1, "x": 1})).is_err()
    );
}

fn sorted(mut v: Vec<&str>) -> Vec<&str> {
    v.sort_unstable();
    v
}

/// Each tool's output schema is the one generated from the type of its structured
/// result: the result type of the method it calls (as the catalogue has it), or the
/// tool's own type for the tools that reshape the result.
#[test]
fn output_schemas_are_generated_from_the_result_types() {
    type Case = (&'static str, Value, &'static str, Option<&'static str>);
    fn case<T: JsonSchema>(tool: &'static str, method: Option<&'static str>) -> Case {
        let schema = match method {
            Some(_) => output_schema::<T>(),
            None => own_output_schema::<T>(),
        };
        (tool, schema, std::any::type_name::<T>(), method)
    }
    let cases = [
        case::<api::Sandbox>("sandbox_create", Some("sandbox/create")),
        case::<api::SandboxList>("sandbox_list", Some("sandbox/list")),
        case::<api::DiffResult>("sandbox_diff", Some("sandbox/diff")),
        case::<api::ApplyResult>("sandbox_apply", Some("sandbox/apply")),
        case::<api::DiscardResult>("sandbox_discard", Some("sandbox/discard")),
        case::<api::LogResult>("sandbox_log", Some("sandbox/log")),
        case::<api::Sandbox>("sandbox_info", Some("sandbox/info")),
        case::<api::KillResult>("sandbox_kill", Some("sandbox/kill")),
        case::<api::Sandbox>("sandbox_set_timeout", Some("sandbox/setTimeout")),
        case::<api::Sandbox>("sandbox_set_network", Some("sandbox/setNetwork")),
        case::<ExecOutcome>("exec", None),
        case::<api::CodeResult>("run_code", Some("code/run")),
        case::<api::CodeContext>("code_context_create", Some("code/createContext")),
        case::<api::CodeContexts>("code_context_list", Some("code/listContexts")),
        case::<api::CodeContext>("code_context_restart", Some("code/restartContext")),
        case::<api::Empty>("code_context_remove", Some("code/removeContext")),
        case::<ReadOutcome>("files_read", None),
        case::<WriteOutcome>("files_write", None),
        case::<api::FileList>("files_list", Some("files/list")),
        case::<api::PortUrl>("ports_url", Some("ports/url")),
        case::<api::ProviderList>("provider_list", Some("provider/list")),
    ];
    assert_eq!(cases.len(), TOOLS.len());
    for (tool, schema, ty, method) in cases {
        let d = TOOLS.iter().find(|d| d.name == tool).expect(tool);
        assert_eq!((d.output)(), schema, "{tool}: not generated from {ty}");
        assert_eq!(schema["type"], "object", "{tool}");
        if let Some(m) = method {
            let result = abx_protocol::catalogue::method(m)
                .and_then(|m| m.result.as_ref())
                .and_then(|r| r.type_name());
            assert_eq!(result, Some(ty), "{tool}: {m}'s result type");
        }
    }
    // What the hand-written sandbox schema lacked.
    let sandbox = output_schema::<api::Sandbox>();
    for k in ["templateDigest", "network"] {
        assert!(sandbox["properties"].get(k).is_some(), "{k}: {sandbox}");
    }
    // The tools' own results serialize as their schemas say (optional members left out).
    let exec = json!(ExecOutcome {
        exit_code: None,
        stdout: String::new(),
        stderr: String::new(),
        timed_out: false,
        signal: None,
        truncated: false,
    });
    let schema = own_output_schema::<ExecOutcome>();
    let required: Vec<&str> = schema["required"]
        .as_array()
        .expect("required")
        .iter()
        .map(|k| k.as_str().unwrap())
        .collect();
    let members: Vec<&str> = exec.as_object().unwrap().keys().map(|k| &**k).collect();
    assert_eq!(
        sorted(required),
        sorted(members),
        "exec's result: every member it always has is required"
    );
    assert!(exec.get("signal").is_none());
}

#[test]
fn every_tool_has_an_object_schema() {
    for era in [Era::Handshake("2024-11-05"), Era::Modern] {
        for t in list(era) {
            assert_eq!(t["inputSchema"]["type"], "object", "{}", t["name"]);
            assert_eq!(t["inputSchema"]["additionalProperties"], false);
            if era == Era::Modern {
                assert!(t["outputSchema"].is_object(), "{}", t["name"]);
                let extra = t["outputSchema"].get("additionalProperties");
                assert!(extra.is_none(), "{}", t["name"]);
            } else {
                assert!(t.get("outputSchema").is_none());
            }
        }
    }
    assert_eq!(
        parent("/workspace/a/b.txt").as_deref(),
        Some("/workspace/a")
    );
    assert_eq!(parent("b.txt"), None);
    assert_eq!(parent("d/b.txt").as_deref(), Some("d"));
}
