//! `templates/init {language, path, force?}`: writes a template scaffold (a `Dockerfile` and
//! a `README.md`) for a language into a directory of the broker's machine, as the reference
//! tool's `template init` does (issue 49), for `templates/build {context, name}` to build.
//!
//! Its `FROM` is an image the user can have: one of the store whose repository is the
//! language's (`python:3.11` stored: `FROM python:3.11`), else the language's default image,
//! with a `hint` naming the command that gets it (`abx template pull python:3.12-slim`):
//! never, silently, an image that cannot be had offline. Nothing is overwritten without
//! `force` (E4006 names the first file in the way, before anything is written); an unknown
//! language is E1004 listing the supported ones.

use super::Store;
use abx_home::util::replace_file;
use abx_protocol::{AbxError, ErrorCode};
use serde_json::{json, Map, Value};
use std::path::{Path, PathBuf};

const METHOD: &str = "templates/init";

/// One language the scaffold knows.
pub struct Language {
    /// Its name (`python`).
    pub name: &'static str,
    /// Other names it answers to (`py`).
    pub aliases: &'static [&'static str],
    /// The image's repository as Docker Hub names it (`python`, `golang`).
    pub repository: &'static str,
    /// The image named when none of the store fits.
    pub default_image: &'static str,
    /// Dockerfile lines after `FROM` (commented examples and the settings of the language).
    body: &'static str,
    /// How to check the image in a sandbox of the built template.
    check: &'static str,
}

/// The languages, in the order they are listed.
pub const LANGUAGES: &[Language] = &[
    Language {
        name: "python",
        aliases: &["py", "python3"],
        repository: "python",
        default_image: "python:3.12-slim",
        body: "ENV PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1\n\
               # Packages (the build has no network unless --network internet is given):\n\
               # RUN pip install numpy pandas\n",
        check: "python3 --version",
    },
    Language {
        name: "node",
        aliases: &["javascript", "js", "nodejs", "typescript", "ts"],
        repository: "node",
        default_image: "node:22-slim",
        body: "ENV NODE_ENV=development\n\
               # Packages (the build has no network unless --network internet is given):\n\
               # RUN npm install -g typescript\n",
        check: "node --version",
    },
    Language {
        name: "go",
        aliases: &["golang"],
        repository: "golang",
        default_image: "golang:1.23",
        body: "ENV CGO_ENABLED=0\n\
               # Modules (the build has no network unless --network internet is given):\n\
               # RUN go install golang.org/x/tools/gopls@latest\n",
        check: "go version",
    },
    Language {
        name: "rust",
        aliases: &["rs"],
        repository: "rust",
        default_image: "rust:1-slim",
        body: "# Crates and tools (the build has no network unless --network internet is given):\n\
               # RUN cargo install ripgrep\n",
        check: "cargo --version",
    },
    Language {
        name: "java",
        aliases: &["jdk"],
        repository: "eclipse-temurin",
        default_image: "eclipse-temurin:21-jdk",
        body: "# Tools (the build has no network unless --network internet is given):\n\
               # RUN apt-get update && apt-get install -y --no-install-recommends maven\n",
        check: "java -version",
    },
    Language {
        name: "shell",
        aliases: &["bash", "sh", "debian"],
        repository: "debian",
        default_image: "debian:12-slim",
        body: "# Packages (the build has no network unless --network internet is given):\n\
               # RUN apt-get update && apt-get install -y --no-install-recommends curl jq\n",
        check: "bash --version",
    },
];

/// The language a name means (its name or an alias, any case).
pub fn language(name: &str) -> Option<&'static Language> {
    let n = name.trim().to_ascii_lowercase();
    LANGUAGES
        .iter()
        .find(|l| l.name == n || l.aliases.contains(&n.as_str()))
}

fn supported() -> String {
    LANGUAGES
        .iter()
        .map(|l| l.name)
        .collect::<Vec<_>>()
        .join(", ")
}

/// The repository of an image name as Docker Hub would read it (`python`,
/// `library/python`, `docker.io/library/python:3` -> `python`; `reg:5000/team/python:3` ->
/// `team/python`), and whether it is Docker Hub's.
fn repository_of(name: &str) -> (String, bool) {
    let no_digest = name.split('@').next().unwrap_or(name);
    // The tag is after the last ':' that follows the last '/'.
    let slash = no_digest.rfind('/').map_or(0, |i| i + 1);
    let repo = match no_digest[slash..].find(':') {
        Some(i) => &no_digest[..slash + i],
        None => no_digest,
    };
    let mut parts: Vec<&str> = repo.split('/').collect();
    let first_is_host = parts.len() > 1
        && (parts[0].contains('.') || parts[0].contains(':') || parts[0] == "localhost");
    let hub = !first_is_host || parts[0] == "docker.io" || parts[0] == "index.docker.io";
    if first_is_host {
        parts.remove(0);
    }
    if hub && parts.len() == 2 && parts[0] == "library" {
        parts.remove(0);
    }
    (parts.join("/"), hub)
}

/// The image the scaffold's `FROM` names, from the names of the store: the language's
/// default image when it is stored; else a stored Docker Hub image of the language's
/// repository; else one of that repository's name on another registry; else nothing (the
/// default, with a hint to pull it).
pub fn pick_from(lang: &Language, stored: &[String]) -> Option<String> {
    if stored.iter().any(|n| n == lang.default_image) {
        return Some(lang.default_image.to_owned());
    }
    let mut hub: Vec<&String> = Vec::new();
    let mut other: Vec<&String> = Vec::new();
    for n in stored {
        let (repo, is_hub) = repository_of(n);
        if is_hub && repo == lang.repository {
            hub.push(n);
        } else if repo.rsplit('/').next() == Some(lang.repository) {
            other.push(n);
        }
    }
    hub.sort();
    other.sort();
    hub.into_iter().chain(other).next().cloned()
}

fn dockerfile(lang: &Language, from: &str, name: &str, dir: &Path) -> String {
    format!(
        "# A template for abx sandboxes ({lang}), written by `abx template init`.\n\
         # Build it:  abx template build {dir} -t {name}\n\
         # Use it:    abx create --template {name}\n\
         FROM {from}\n\
         {body}\
         WORKDIR /workspace\n",
        lang = lang.name,
        dir = dir.display(),
        body = lang.body,
    )
}

fn readme(lang: &Language, from: &str, hint: Option<&str>, name: &str, dir: &Path) -> String {
    let get = match hint {
        Some(h) => format!("\n{h}\n"),
        None => format!("\n`{from}` is in the broker's store (`abx template list`).\n"),
    };
    format!(
        "# {name}\n\n\
         An abx template for {lang}, built from the `Dockerfile` beside this file on top of\n\
         `{from}`.\n{get}\n\
         ## Build\n\n\
         ```sh\n\
         abx template build {dir} -t {name}\n\
         ```\n\n\
         Progress is printed as `docker build` prints it (`[2/4] RUN ...`); Ctrl-C stops the\n\
         build. The build has no network unless `--network internet` is given (packages from\n\
         a registry need it); `--build-arg K=V` sets an `ARG`, `--no-cache` rebuilds every step.\n\n\
         ## Use\n\n\
         ```sh\n\
         abx create --template {name}\n\
         abx run --template {name} -- {check}\n\
         ```\n",
        lang = lang.name,
        dir = dir.display(),
        check = lang.check,
    )
}

/// `templates/init`: params are the request's members (`language`, `path`, `force`).
pub fn init(store: &Store, params: &Map<String, Value>) -> Result<Value, AbxError> {
    let s = |k: &str| {
        params
            .get(k)
            .and_then(Value::as_str)
            .map(str::trim)
            .filter(|v| !v.is_empty())
    };
    let force = match params.get("force") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err(AbxError::invalid_params(METHOD, "`force` is a boolean")),
    };
    let Some(lname) = s("language").or_else(|| s("template")) else {
        return Err(AbxError::invalid_params(
            METHOD,
            format!("missing field `language` (one of {})", supported()),
        ));
    };
    let lang = language(lname).ok_or_else(|| {
        AbxError::invalid_params(
            METHOD,
            format!(
                "unknown language '{lname}': the scaffolds are {}",
                supported()
            ),
        )
        .with_suggestion(format!(
            "Pick one of {} (abx template init LANGUAGE [DIR]).",
            supported()
        ))
    })?;
    let path = s("path").ok_or_else(|| {
        AbxError::invalid_params(METHOD, "missing field `path` (an absolute directory)")
    })?;
    let dir = PathBuf::from(path);
    if !dir.is_absolute() {
        return Err(AbxError::invalid_params(
            METHOD,
            format!("`path` must be absolute (a directory of the broker's machine), not '{path}'"),
        ));
    }
    if let Ok(m) = std::fs::metadata(&dir) {
        if !m.is_dir() {
            return Err(AbxError::new(
                ErrorCode::FileExists,
                &[("path", &dir.display().to_string())],
            )
            .with_suggestion("It is not a directory: choose another path for the template."));
        }
    }
    let files = [dir.join("Dockerfile"), dir.join("README.md")];
    if !force {
        if let Some(f) = files.iter().find(|f| f.symlink_metadata().is_ok()) {
            return Err(AbxError::new(
                ErrorCode::FileExists,
                &[("path", &f.display().to_string())],
            )
            .with_suggestion(
                "Nothing was written. Pass --force (force: true) to overwrite the scaffold's files, or choose another directory.",
            ));
        }
    }
    let stored: Vec<String> = store.list().into_iter().flat_map(|(_, n)| n).collect();
    let (from, hint) = match pick_from(lang, &stored) {
        Some(f) => (f, None),
        None => {
            let d = lang.default_image;
            (
                d.to_owned(),
                Some(format!(
                    "`{d}` is not in the broker's store: the build pulls it when its registry can be reached; to have it offline, get it first with `abx template pull {d}` (or import a `docker save` archive of it: `abx template import FILE {d}`)."
                )),
            )
        }
    };
    let name = dir
        .file_name()
        .and_then(|n| n.to_str())
        .filter(|n| !n.is_empty())
        .map(template_name)
        .unwrap_or_else(|| lang.name.to_owned());
    let texts = [
        dockerfile(lang, &from, &name, &dir),
        readme(lang, &from, hint.as_deref(), &name, &dir),
    ];
    std::fs::create_dir_all(&dir).map_err(|e| write_err(&dir, e))?;
    for (f, t) in files.iter().zip(&texts) {
        replace_file(f, t.as_bytes()).map_err(|e| write_err(f, e))?;
    }
    let mut r = json!({
        "path": dir,
        "language": lang.name,
        "files": files,
        "from": from,
        "name": name,
    });
    if let Some(h) = hint {
        r["hint"] = json!(h);
    }
    Ok(r)
}

/// A template name from a directory's name: lowercase, `[a-z0-9._-]`, others as `-`.
fn template_name(dir: &str) -> String {
    let n: String = dir
        .chars()
        .map(|c| {
            let c = c.to_ascii_lowercase();
            if c.is_ascii_alphanumeric() || "._-".contains(c) {
                c
            } else {
                '-'
            }
        })
        .collect();
    let n = n.trim_matches(|c| c == '-' || c == '.').to_owned();
    if n.is_empty() {
        "template".to_owned()
    } else {
        n
    }
}

fn write_err(path: &Path, e: std::io::Error) -> AbxError {
    AbxError::new(
        ErrorCode::LocalFileError,
        &[
            ("path", &path.display().to_string()),
            ("detail", &e.to_string()),
        ],
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn languages_and_aliases() {
        assert_eq!(language("Python").unwrap().name, "python");
        assert_eq!(language("js").unwrap().name, "node");
        assert_eq!(language("golang").unwrap().name, "go");
        assert!(language("cobol").is_none());
    }

    #[test]
    fn repositories_as_docker_hub_reads_them() {
        assert_eq!(repository_of("python:3.11"), ("python".into(), true));
        assert_eq!(
            repository_of("docker.io/library/python:3"),
            ("python".into(), true)
        );
        assert_eq!(repository_of("library/node"), ("node".into(), true));
        assert_eq!(
            repository_of("127.0.0.1:5000/team/python:3@sha256:ab"),
            ("team/python".into(), false)
        );
        assert_eq!(repository_of("me/python:1"), ("me/python".into(), true));
    }

    #[test]
    fn from_prefers_the_default_then_docker_hub_then_another_registry() {
        let py = language("python").unwrap();
        let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        assert_eq!(pick_from(py, &s(&["busybox:1", "base"])), None);
        assert_eq!(
            pick_from(py, &s(&["reg.example/ml/python:3", "python:3.11"])).as_deref(),
            Some("python:3.11")
        );
        assert_eq!(
            pick_from(py, &s(&["python:3.11", "python:3.12-slim"])).as_deref(),
            Some("python:3.12-slim")
        );
        assert_eq!(
            pick_from(py, &s(&["reg.example/ml/python:3"])).as_deref(),
            Some("reg.example/ml/python:3")
        );
        assert_eq!(pick_from(py, &s(&["me/pythonic:1"])), None);
    }

    #[test]
    fn template_names_from_directories() {
        assert_eq!(template_name("My Python"), "my-python");
        assert_eq!(template_name("..."), "template");
        assert_eq!(template_name("tpl_1.0"), "tpl_1.0");
    }
}
