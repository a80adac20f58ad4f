//! `abx template build` and `abx template init` (issue 49): a Dockerfile build
//! (`templates/build {context, dockerfile?, name, buildArgs?, target?, network?, noCache?}`)
//! with its `templates/progress` printed as `docker build` prints its steps, Ctrl-C (or
//! SIGTERM, SIGHUP) cancelling it (`$/cancelRequest`: the broker stops the build); the old
//! form `abx template build SANDBOX NAME` saves a sandbox. `init` writes a scaffold through
//! `templates/init {language, path, force?}`; `pull` draws its progress on a terminal and
//! Ctrl-C cancels it. The other template actions are in `provider.rs`.

use super::Ctx;
use crate::args::{TemplateBuildArgs, TemplateInitArgs};
use crate::output::{line, print_json, text, Failure};
use abx_protocol::api::{self, to_params};
use abx_protocol::{AbxError, ErrorCode};
use serde_json::{json, Map, Value};
use std::path::{Path, PathBuf};

/// `abx template build ...`: a Dockerfile build, or a sandbox saved.
pub async fn build(cx: &Ctx, a: TemplateBuildArgs) -> Result<u8, Failure> {
    if !a.is_dockerfile_build() {
        let Some(name) = a.name.clone() else {
            return Err(Failure::usage(
                format!(
                    "'{}' is not a directory: a sandbox is saved as NAME, which is missing",
                    a.source
                ),
                "Usage: abx template build DIR -t NAME (a Dockerfile), or abx template build SANDBOX NAME",
            ));
        };
        return super::provider::template(cx, "build", &[a.source, name]).await;
    }
    let params = build_params(cx, &a)?;
    let name = params.name.clone().unwrap_or_default();
    let mut c = cx.connect().await?;
    let mut ending = crate::stream::Ending::new();
    let id = c
        .send_request("templates/build", Some(&to_params(&params)))
        .await
        .map_err(|e| Failure::from(e).in_method("templates/build"))?;
    let mut steps = Steps::default();
    let quiet = cx.json;
    let mut on_note = |n: &abx_protocol::message::Notification| {
        if quiet || n.method != "templates/progress" {
            return;
        }
        let Some(v) = n
            .params
            .as_deref()
            .and_then(|p| serde_json::from_str::<Value>(p.get()).ok())
        else {
            return;
        };
        if v["template"].as_str().is_some_and(|t| t != name) {
            return;
        }
        for l in steps.lines(&v) {
            eprintln!("{l}");
        }
    };
    let sig = tokio::select! {
        r = c.reply_watching(&id, &mut on_note) => {
            let r = r.map_err(|e| Failure::from(e).in_method("templates/build"))?;
            if cx.json {
                print_json(&r);
            } else {
                line(&built_line(&r, &name));
            }
            return Ok(0);
        }
        _ = tokio::signal::ctrl_c() => libc::SIGINT,
        sig = ending.recv() => sig,
    };
    crate::stream::cancel_and_wait(&mut c, &id).await;
    eprintln!("abx: the build of '{name}' was cancelled (nothing was stored).");
    Ok((128 + sig) as u8)
}

/// The `templates/build` params of a Dockerfile build (paths made absolute here: the broker
/// reads them).
pub fn build_params(cx: &Ctx, a: &TemplateBuildArgs) -> Result<api::TemplatesBuildParams, Failure> {
    let name = match (&a.tag, &a.name) {
        (Some(t), Some(n)) if t != n => {
            return Err(Failure::usage(
                format!("two names for one template: -t {t} and {n}"),
                "Usage: abx template build DIR -t NAME",
            ))
        }
        (Some(t), _) | (None, Some(t)) => t.clone(),
        (None, None) => {
            return Err(Failure::usage(
                "the template's name is missing".to_owned(),
                format!("Name it with -t: abx template build {} -t NAME", a.source),
            ))
        }
    };
    let context = std::path::absolute(&a.source).unwrap_or_else(|_| PathBuf::from(&a.source));
    // With --host the context is a directory of the broker's machine: it is not looked at here.
    let remote = matches!(abx_client::remote::current(), Ok(Some(_)));
    if !remote && !context.is_dir() {
        return Err(local_error(
            &context,
            "not a directory (the build context: a directory with a Dockerfile)",
        ));
    }
    let dockerfile = match &a.file {
        None => None,
        Some(f) if remote => Some(f.clone()),
        Some(f) => Some(dockerfile_in(&context, f)?),
    };
    let build_args = (!a.build_args.is_empty()).then(|| a.build_args.iter().cloned().collect());
    Ok(api::TemplatesBuildParams {
        provider: cx.provider.clone(),
        sandbox: None,
        name: Some(name),
        context: Some(context.display().to_string()),
        dockerfile,
        build_args,
        target: a.target.clone(),
        network: a.network.as_deref().map(network),
        no_cache: a.no_cache.then_some(true),
        rest: Map::new(),
    })
}

/// `--network`: a mode, or `allow:HOST,...` as a policy (as `abx create` sends it).
fn network(n: &str) -> Value {
    match n.strip_prefix("allow:") {
        Some(hosts) => json!({"allow": hosts
            .split(',')
            .map(str::trim)
            .filter(|h| !h.is_empty())
            .collect::<Vec<_>>()}),
        None => json!(n),
    }
}

/// `-f FILE` as the broker takes it: relative to the context. FILE is a path from here (as
/// docker reads it) when that exists, else from the context; either way inside it.
fn dockerfile_in(context: &Path, f: &str) -> Result<String, Failure> {
    let here = std::path::absolute(f).unwrap_or_else(|_| PathBuf::from(f));
    let p = if here.exists() || Path::new(f).is_absolute() {
        here
    } else {
        context.join(f)
    };
    if !p.is_file() {
        return Err(local_error(&p, "no such Dockerfile"));
    }
    let canon = |p: &Path| std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf());
    let (ctx, file) = (canon(context), canon(&p));
    match file.strip_prefix(&ctx) {
        Ok(rel) if !rel.as_os_str().is_empty() => Ok(rel.display().to_string()),
        _ => Err(Failure::usage(
            format!(
                "the Dockerfile '{}' is not inside the build context '{}'",
                p.display(),
                context.display()
            ),
            "Put the Dockerfile in the context directory (or a directory under it) and name it with -f.",
        )),
    }
}

fn local_error(path: &Path, detail: &str) -> Failure {
    AbxError::new(
        ErrorCode::LocalFileError,
        &[("path", &path.display().to_string()), ("detail", detail)],
    )
    .with_suggestion(
        "Give the build context as a directory of this machine: abx template build DIR -t NAME.",
    )
    .into()
}

/// What a finished build prints (without -j).
fn built_line(r: &Value, name: &str) -> String {
    let digest: String = r["digest"]
        .as_str()
        .map(|d| d.trim_start_matches("sha256:").chars().take(12).collect())
        .unwrap_or_default();
    let name = r["name"].as_str().unwrap_or(name);
    format!(
        "Built template '{name}' ({digest}, {} bytes). Use it: abx create --template {name}",
        r["size"].as_u64().unwrap_or(0)
    )
}

/// The progress lines of a build, as `docker build` prints its steps: the step when it
/// starts (`[2/4] RUN make`, or `CACHED [2/4] RUN make` for a cache hit), then its output
/// lines indented.
#[derive(Default)]
pub struct Steps {
    step: Option<String>,
    cached: bool,
}

impl Steps {
    /// The lines a `templates/progress` notification adds.
    pub fn lines(&mut self, v: &Value) -> Vec<String> {
        let mut out = Vec::new();
        let step = v["step"].as_str().unwrap_or_default();
        let cached = v["cached"] == true;
        if !step.is_empty() && self.step.as_deref() != Some(step) {
            self.step = Some(step.to_owned());
            self.cached = cached;
            out.push(if cached {
                format!("CACHED {step}")
            } else {
                step.to_owned()
            });
        } else if cached && !self.cached {
            self.cached = true;
            out.push("  CACHED".to_owned());
        }
        if let Some(l) = v["line"].as_str() {
            out.extend(
                l.trim_end_matches(['\r', '\n'])
                    .lines()
                    .map(|l| format!("  {l}")),
            );
        }
        out
    }
}

/// `abx template pull REF`: as before (the result as JSON), with the pull's progress drawn on
/// one line of stderr when it is a terminal (never with -j), and Ctrl-C (SIGTERM, SIGHUP)
/// cancelling the pull (`$/cancelRequest`).
pub async fn pull(cx: &Ctx, reference: &str) -> Result<u8, Failure> {
    let mut rest = Map::new();
    rest.insert("args".into(), json!([reference]));
    rest.insert("template".into(), json!(reference));
    let params = api::TemplatesParams {
        provider: cx.provider.clone(),
        rest,
    };
    let mut c = cx.connect().await?;
    let mut ending = crate::stream::Ending::new();
    let id = c
        .send_request("templates/pull", Some(&to_params(&params)))
        .await
        .map_err(|e| Failure::from(e).in_method("templates/pull"))?;
    let draw = !cx.json && crate::term::stderr_is_tty();
    let mut drawn = false;
    let mut on_note = |n: &abx_protocol::message::Notification| {
        if !draw || n.method != "templates/progress" {
            return;
        }
        if let Some(v) = n
            .params
            .as_deref()
            .and_then(|p| serde_json::from_str::<Value>(p.get()).ok())
        {
            use std::io::Write;
            let mut e = std::io::stderr();
            let _ = write!(e, "\r\x1b[K{}", pull_line(&v));
            let _ = e.flush();
            drawn = true;
        }
    };
    let sig = tokio::select! {
        r = c.reply_watching(&id, &mut on_note) => {
            if drawn {
                eprint!("\r\x1b[K");
            }
            let r = r.map_err(|e| Failure::from(e).in_method("templates/pull"))?;
            if cx.json {
                print_json(&r);
            } else {
                line(&serde_json::to_string_pretty(&r).unwrap_or_default());
            }
            return Ok(0);
        }
        _ = tokio::signal::ctrl_c() => libc::SIGINT,
        sig = ending.recv() => sig,
    };
    crate::stream::cancel_and_wait(&mut c, &id).await;
    eprintln!("\r\x1b[Kabx: the pull of '{reference}' was cancelled.");
    Ok((128 + sig) as u8)
}

/// The progress line of a pull: `pulling REF  STEP  1.5 MiB / 20.0 MiB`.
fn pull_line(v: &Value) -> String {
    let h = super::files::human_bytes;
    let step = v["step"].as_str().unwrap_or_default();
    let step = match step.strip_prefix("sha256:") {
        Some(hex) => hex.chars().take(12).collect(),
        None => step.to_owned(),
    };
    format!(
        "pulling {}  {step}  {} / {}",
        v["template"].as_str().unwrap_or_default(),
        h(v["bytes"].as_u64().unwrap_or(0)),
        h(v["total"].as_u64().unwrap_or(0))
    )
}

/// `abx template init LANGUAGE [DIR] [--force]`.
pub async fn init(cx: &Ctx, a: TemplateInitArgs) -> Result<u8, Failure> {
    let language = a.language.or(a.template).unwrap_or_default();
    let dir = a.dir.unwrap_or_else(|| language.clone());
    let path = std::path::absolute(&dir).unwrap_or_else(|_| PathBuf::from(&dir));
    let params = api::TemplatesInitParams {
        provider: cx.provider.clone(),
        language: Some(language.clone()),
        path: Some(path.display().to_string()),
        force: a.force.then_some(true),
        rest: Map::new(),
    };
    let r = super::call1(cx, "templates/init", to_params(&params)).await?;
    if cx.json {
        print_json(&r);
    } else {
        for l in init_lines(&r, &language) {
            line(&l);
        }
    }
    Ok(0)
}

/// What `abx template init` prints: the reference's layout (created where, the files, the
/// next steps), with where the FROM image comes from.
pub fn init_lines(r: &Value, language: &str) -> Vec<String> {
    let dir = text(&r["path"]);
    let mut out = vec![
        format!(
            "Template '{}' created in {dir}",
            r["language"].as_str().unwrap_or(language)
        ),
        "Created files:".to_owned(),
    ];
    for f in r["files"].as_array().into_iter().flatten() {
        let f = f.as_str().unwrap_or_default();
        let rel = Path::new(f)
            .strip_prefix(&dir)
            .map_or_else(|_| f.to_owned(), |p| p.display().to_string());
        out.push(format!("  {rel}"));
    }
    let from = r["from"].as_str().unwrap_or_default();
    let hint = r["hint"].as_str();
    out.push(String::new());
    if let Some(h) = hint {
        out.push(format!("FROM {from}: {h}"));
    } else if !from.is_empty() {
        out.push(format!("FROM {from} (in the broker's store)"));
    }
    let name = r["name"].as_str().map_or_else(
        || {
            Path::new(&dir)
                .file_name()
                .map_or("NAME".to_owned(), |n| n.to_string_lossy().into_owned())
        },
        str::to_owned,
    );
    out.push(String::new());
    out.push("Next steps:".to_owned());
    if hint.is_some() && !from.is_empty() {
        out.push(format!("  abx template pull {from}"));
    }
    out.push(format!("  abx template build {dir} -t {name}"));
    out.push(format!("  abx create --template {name}"));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_print_as_docker_build_does() {
        let mut s = Steps::default();
        let mut all = Vec::new();
        for v in [
            json!({"template": "t", "step": "[1/3] FROM scratch", "bytes": 0, "total": 3, "cached": true}),
            json!({"template": "t", "step": "[2/3] RUN make", "bytes": 1, "total": 3}),
            json!({"template": "t", "step": "[2/3] RUN make", "bytes": 1, "total": 3, "line": "cc -o a a.c\n"}),
            json!({"template": "t", "step": "[2/3] RUN make", "bytes": 1, "total": 3, "line": "done"}),
            json!({"template": "t", "step": "[3/3] COPY a /a", "bytes": 2, "total": 3}),
            json!({"template": "t", "step": "[3/3] COPY a /a", "bytes": 2, "total": 3, "cached": true}),
        ] {
            all.extend(s.lines(&v));
        }
        assert_eq!(
            all,
            [
                "CACHED [1/3] FROM scratch",
                "[2/3] RUN make",
                "  cc -o a a.c",
                "  done",
                "[3/3] COPY a /a",
                "  CACHED"
            ]
        );
    }

    #[test]
    fn init_prints_the_files_and_the_next_steps() {
        let r = json!({"path": "/p/py", "files": ["/p/py/Dockerfile", "/p/py/README.md"],
            "from": "python:3.12-slim", "name": "py", "language": "python",
            "hint": "`python:3.12-slim` is not in the broker's store: ..."});
        let l = init_lines(&r, "python");
        assert_eq!(l[0], "Template 'python' created in /p/py");
        assert_eq!(&l[1..4], ["Created files:", "  Dockerfile", "  README.md"]);
        assert!(
            l.contains(&"  abx template pull python:3.12-slim".to_owned()),
            "{l:?}"
        );
        assert!(
            l.contains(&"  abx template build /p/py -t py".to_owned()),
            "{l:?}"
        );
        let stored = json!({"path": "/p/py", "files": [], "from": "python:3.11", "name": "py"});
        let l = init_lines(&stored, "python");
        assert!(l.contains(&"FROM python:3.11 (in the broker's store)".to_owned()));
        assert!(!l.iter().any(|x| x.contains("pull")), "{l:?}");
    }

    #[test]
    fn a_pull_draws_its_step_and_bytes() {
        let v = json!({"template": "busybox:1", "bytes": 1536, "total": 2 << 20,
            "step": "sha256:0123456789abcdef0123"});
        assert_eq!(
            pull_line(&v),
            "pulling busybox:1  0123456789ab  1.5 KiB / 2.0 MiB"
        );
    }

    #[test]
    fn network_modes_and_policies() {
        assert_eq!(network("internet"), json!("internet"));
        assert_eq!(
            network("allow:a.example, b.example"),
            json!({"allow": ["a.example", "b.example"]})
        );
    }

    #[test]
    fn the_dockerfile_is_named_from_the_context() {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(d.path().join("docker")).unwrap();
        std::fs::write(d.path().join("docker/Dev.Dockerfile"), "FROM scratch\n").unwrap();
        assert_eq!(
            dockerfile_in(d.path(), "docker/Dev.Dockerfile").unwrap(),
            "docker/Dev.Dockerfile"
        );
        let abs = d.path().join("docker/Dev.Dockerfile");
        assert_eq!(
            dockerfile_in(d.path(), abs.to_str().unwrap()).unwrap(),
            "docker/Dev.Dockerfile"
        );
        let out = tempfile::tempdir().unwrap();
        std::fs::write(out.path().join("Dockerfile"), "FROM scratch\n").unwrap();
        let e =
            dockerfile_in(d.path(), out.path().join("Dockerfile").to_str().unwrap()).unwrap_err();
        assert_eq!(e.exit, 2, "{e:?}");
        assert_eq!(dockerfile_in(d.path(), "nope").unwrap_err().abx, "E4009");
    }
}
