//! Archive sources (`.tar.gz` / `.tgz` over https, or http with `allow_insecure_transport`):
//! downloaded with reqwest (size-limited), listed with the system `tar` (only regular files
//! and directories, no absolute names or `..`), then extracted without owners or modes.

use super::*;

pub(super) async fn download(url: &str, dest: &Path, allow_insecure: bool) -> Result<(), AbxError> {
    use tokio::io::AsyncWriteExt;
    let parsed = reqwest::Url::parse(url).map_err(|e| unreachable_source(url, e))?;
    let policy = reqwest::redirect::Policy::custom(move |attempt| {
        if attempt.previous().len() >= 10 {
            attempt.error("too many redirects")
        } else if attempt.url().scheme() != "https" && !allow_insecure {
            attempt.error("redirected to an insecure URL (--allow-insecure-transport accepts it)")
        } else {
            attempt.follow()
        }
    });
    let mut builder = reqwest::Client::builder()
        .redirect(policy)
        .connect_timeout(std::time::Duration::from_secs(30))
        .timeout(std::time::Duration::from_secs(600))
        .user_agent(concat!("abx/", env!("CARGO_PKG_VERSION")));
    if parsed.host_str().is_some_and(is_loopback) {
        builder = builder.no_proxy();
    }
    let client = builder.build().map_err(|e| unreachable_source(url, e))?;
    let fail = |e: reqwest::Error| {
        let mut detail = e.to_string();
        let mut src = std::error::Error::source(&e);
        while let Some(s) = src {
            detail.push_str(": ");
            detail.push_str(&s.to_string());
            src = s.source();
        }
        unreachable_source(url, detail)
    };
    let mut resp = client.get(parsed).send().await.map_err(fail)?;
    if !resp.status().is_success() {
        return Err(unreachable_source(url, format!("HTTP {}", resp.status())));
    }
    let over = || too_big("Refusing an archive over 256 MiB.".to_string());
    if resp.content_length().is_some_and(|n| n > MAX_DOWNLOAD) {
        return Err(over());
    }
    let mut file = tokio::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(dest)
        .await
        .map_err(|e| AbxError::internal(format!("creating {}: {e}", dest.display())))?;
    let mut got = 0u64;
    while let Some(chunk) = resp.chunk().await.map_err(fail)? {
        got += chunk.len() as u64;
        if got > MAX_DOWNLOAD {
            return Err(over());
        }
        file.write_all(&chunk)
            .await
            .map_err(|e| AbxError::internal(format!("writing {}: {e}", dest.display())))?;
    }
    file.flush()
        .await
        .map_err(|e| AbxError::internal(format!("writing {}: {e}", dest.display())))?;
    Ok(())
}

/// One member of `tar -tv` output: type char, size, name.
pub(super) fn parse_listing_line(line: &str) -> Option<(char, u64, &str)> {
    let kind = line.chars().next()?;
    let mut rest = line;
    let mut fields = Vec::with_capacity(5);
    for _ in 0..5 {
        rest = rest.trim_start();
        let end = rest.find(char::is_whitespace)?;
        fields.push(&rest[..end]);
        rest = &rest[end..];
    }
    let name = rest.strip_prefix(' ')?;
    // Devices list "major,minor" where the size would be: only files need a size.
    let size = match fields[2].parse() {
        Ok(n) => n,
        Err(_) if kind != '-' => 0,
        Err(_) => return None,
    };
    Some((kind, size, name))
}

pub(super) fn tar(args: &[&std::ffi::OsStr]) -> io::Result<std::process::Output> {
    Command::new("tar")
        .args(args)
        .env("LC_ALL", "C")
        .env("TZ", "UTC")
        .stdin(std::process::Stdio::null())
        .output()
}

/// List (and refuse anything but plain files and directories with safe names), then extract.
pub(super) fn extract(archive: &Path, dest: &Path, url: &str) -> Result<(), AbxError> {
    let bad_archive = |detail: String| unreachable_source(url, detail);
    let out = tar(&[
        "--list".as_ref(),
        "--verbose".as_ref(),
        "--gzip".as_ref(),
        "--file".as_ref(),
        archive.as_os_str(),
    ])
    .map_err(|e| AbxError::internal(format!("running tar: {e}")))?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        return Err(bad_archive(format!(
            "not a .tar.gz archive ({})",
            err.lines().next().unwrap_or("tar failed").trim()
        )));
    }
    let listing = String::from_utf8_lossy(&out.stdout);
    let mut total = 0u64;
    let mut count = 0usize;
    for line in listing.lines().filter(|l| !l.is_empty()) {
        let Some((kind, size, name)) = parse_listing_line(line) else {
            return Err(bad_archive(format!(
                "unreadable archive listing: {}",
                line.escape_debug()
            )));
        };
        let clean = name.trim_end_matches('/');
        match kind {
            '-' | 'd' => {}
            'l' => {
                let n = clean.split(" -> ").next().unwrap_or(clean);
                return Err(TreeError::Special {
                    path: n.to_owned(),
                    kind: "symlink",
                }
                .refusal());
            }
            'h' => {
                let n = clean.split(" link to ").next().unwrap_or(clean);
                return Err(TreeError::Special {
                    path: n.to_owned(),
                    kind: "hard link",
                }
                .refusal());
            }
            'c' | 'b' => {
                return Err(TreeError::Special {
                    path: clean.to_owned(),
                    kind: "device",
                }
                .refusal())
            }
            'p' => {
                return Err(TreeError::Special {
                    path: clean.to_owned(),
                    kind: "fifo",
                }
                .refusal())
            }
            _ => {
                return Err(TreeError::Special {
                    path: clean.to_owned(),
                    kind: "special file",
                }
                .refusal())
            }
        }
        if clean.starts_with('/') || clean.split('/').any(|c| c == "..") {
            return Err(refused(
                format!(
                    "Refusing an archive with a member outside its root: '{}'.",
                    clean.escape_debug()
                ),
                "Ask the provider's maintainer to publish an archive with relative paths only.",
            ));
        }
        if kind == '-' {
            if size > MAX_FILE {
                return Err(too_big(format!(
                    "Refusing a provider source with a file over 64 MiB: '{clean}' ({size} bytes)."
                )));
            }
            total += size;
            count += 1;
            if total > MAX_TREE {
                return Err(too_big(
                    "Refusing a provider source over 256 MiB in all.".into(),
                ));
            }
            if count > MAX_FILES {
                return Err(too_big(format!(
                    "Refusing a provider source with more than {MAX_FILES} files."
                )));
            }
        }
    }
    mkdir(dest)?;
    let out = tar(&[
        "--extract".as_ref(),
        "--gzip".as_ref(),
        "--file".as_ref(),
        archive.as_os_str(),
        "--directory".as_ref(),
        dest.as_os_str(),
        "--no-same-owner".as_ref(),
        "--no-same-permissions".as_ref(),
        "--no-overwrite-dir".as_ref(),
    ])
    .map_err(|e| AbxError::internal(format!("running tar: {e}")))?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        return Err(bad_archive(format!(
            "extracting failed ({})",
            err.lines().next().unwrap_or("tar failed").trim()
        )));
    }
    Ok(())
}

/// The plugin root of an extracted archive: the top, or its single directory when the top
/// has no manifest.
pub(super) fn archive_root(top: &Path) -> PathBuf {
    if top.join(manifest::FILE_NAME).exists() || top.join(manifest::OLD_FILE_NAME).exists() {
        return top.to_path_buf();
    }
    let entries: Vec<_> = fs::read_dir(top)
        .map(|rd| rd.flatten().collect())
        .unwrap_or_default();
    if let [only] = entries.as_slice() {
        if fs::symlink_metadata(only.path()).is_ok_and(|m| m.is_dir()) {
            return only.path();
        }
    }
    top.to_path_buf()
}
