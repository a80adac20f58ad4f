//! Pulling images from an OCI / Docker registry v2, through `oci-client`.
//!
//! HTTPS everywhere except registries on loopback addresses (`127.0.0.0/8`, `::1`,
//! `localhost`, as Docker does) and those listed in `[local] insecure_registries`.
//! Credentials: `[local.registry_auth]` of the broker config, else `auths.<registry>.auth` of
//! `$DOCKER_CONFIG/config.json` or `~/.docker/config.json` (base64 `user:password`), else
//! anonymous; `oci-client` answers the registry's challenge: HTTP Basic, or the token
//! (Bearer) exchange with the realm the registry names. Credentials are never logged or
//! returned: a registry or token server that refuses them is E8010 with `data.auth`
//! (`required` or `refused`) and a suggestion naming where credentials go, nothing of what
//! the servers answered (a hostile one could echo them). Before credentials are handed to
//! `oci-client`, which sends them to whatever token realm the registry names, the realm is
//! read from the registry's challenge: one on plain HTTP off loopback (and not listed in
//! `insecure_registries`) is refused (E8012), so credentials never travel in the clear.
//! An index is resolved to the manifest of `linux` and the host's architecture. Every blob is
//! hashed while it is written and stored only when it matches its digest (E8013 otherwise).

use super::{Image, ImageConfig, Store};
use abx_home::util::{now_ms, rfc3339};
use abx_protocol::{AbxError, ErrorCode};
use oci_client::client::{ClientConfig, ClientProtocol};
use oci_client::secrets::RegistryAuth;
use oci_client::Reference;
use std::net::IpAddr;

/// Parse an image reference (`busybox:latest`, `reg:5000/ns/img:tag`, `img@sha256:...`).
pub fn parse_ref(s: &str) -> Result<Reference, AbxError> {
    Reference::try_from(s).map_err(|e| {
        AbxError::new(ErrorCode::TemplateNotFound, &[("template", s)]).with_suggestion(format!(
            "'{s}' is not an image reference ({e}); use name[:tag] or name@sha256:<digest>, or 'base' for the host system."
        ))
    })
}

/// The architecture name OCI uses for this machine.
pub fn go_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "x86" => "386",
        "powerpc64" => "ppc64le",
        other => other,
    }
}

/// Whether a registry host (with an optional port) is a loopback address.
pub fn is_loopback(registry: &str) -> bool {
    let host = if let Some(rest) = registry.strip_prefix('[') {
        rest.split(']').next().unwrap_or("")
    } else {
        registry.rsplit_once(':').map_or(registry, |(h, p)| {
            if p.bytes().all(|c| c.is_ascii_digit()) {
                h
            } else {
                registry
            }
        })
    };
    host == "localhost" || host.parse::<IpAddr>().is_ok_and(|a| a.is_loopback())
}

fn docker_config_dir() -> Option<std::path::PathBuf> {
    match std::env::var_os("DOCKER_CONFIG") {
        Some(d) => Some(d.into()),
        None => Some(std::path::Path::new(&std::env::var_os("HOME")?).join(".docker")),
    }
}

fn docker_config_auth(registry: &str) -> Option<(String, String)> {
    let dir = docker_config_dir()?;
    let b = std::fs::read(dir.join("config.json")).ok()?;
    let v: serde_json::Value = serde_json::from_slice(&b).ok()?;
    let auths = v.get("auths")?.as_object()?;
    let keys = [
        registry.to_owned(),
        format!("https://{registry}"),
        format!("http://{registry}"),
        if registry == "docker.io" || registry == "index.docker.io" {
            "https://index.docker.io/v1/".to_owned()
        } else {
            String::new()
        },
    ];
    let entry = keys.iter().find_map(|k| auths.get(k))?;
    let enc = entry.get("auth")?.as_str()?;
    let dec = base64_simd::STANDARD.decode_to_vec(enc.trim()).ok()?;
    let s = String::from_utf8(dec).ok()?;
    let (u, p) = s.split_once(':')?;
    Some((u.to_owned(), p.to_owned()))
}

/// Where the credentials for a registry came from (for errors; never the secret itself).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum AuthFrom {
    None,
    BrokerConfig,
    DockerConfig,
}

fn auth_for(store: &Store, registry: &str) -> (RegistryAuth, AuthFrom) {
    if let Some((u, p)) = store.registry.auth.get(registry) {
        return (
            RegistryAuth::Basic(u.clone(), p.clone()),
            AuthFrom::BrokerConfig,
        );
    }
    match docker_config_auth(registry) {
        Some((u, p)) => (RegistryAuth::Basic(u, p), AuthFrom::DockerConfig),
        None => (RegistryAuth::Anonymous, AuthFrom::None),
    }
}

/// E8010 for a registry (or its token server) that wants credentials or refused them.
fn auth_err(reference: &str, registry: &str, from: AuthFrom) -> AbxError {
    let (detail, state) = match from {
        AuthFrom::None => (
            format!("the registry {registry} asks for credentials and none are configured for it"),
            "required",
        ),
        AuthFrom::BrokerConfig => (
            format!("the registry {registry} refused the credentials of [local.registry_auth] in the broker config"),
            "refused",
        ),
        AuthFrom::DockerConfig => (
            format!("the registry {registry} refused the credentials of auths.\"{registry}\" in the docker config (config.json)"),
            "refused",
        ),
    };
    AbxError::new(
        ErrorCode::SourceUnreachable,
        &[("source", reference), ("detail", &detail)],
    )
    .with_suggestion(format!(
        "Put the credentials for {registry} in the broker config (config.toml: [local.registry_auth] \"{registry}\" = \"user:password\") or in the docker config ($DOCKER_CONFIG/config.json or ~/.docker/config.json: auths.\"{registry}\".auth = base64 of user:password, as 'docker login' writes it), then retry."
    ))
    .with_data("registry", registry)
    .with_data("auth", state)
}

/// The realm of a `Bearer realm="...",service="..."` challenge.
fn bearer_realm(challenge: &str) -> Option<String> {
    let c = challenge.trim();
    let (scheme, params) = c.split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("bearer") {
        return None;
    }
    params.split(',').find_map(|kv| {
        let (k, v) = kv.trim().split_once('=')?;
        k.trim()
            .eq_ignore_ascii_case("realm")
            .then(|| v.trim().trim_matches('"').to_owned())
    })
}

/// The `host[:port]` of a plain-HTTP URL, None for any other.
fn plain_http_host(url: &str) -> Option<&str> {
    let rest = url
        .get(..7)
        .filter(|s| s.eq_ignore_ascii_case("http://"))
        .map(|_| &url[7..])?;
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    Some(authority.rsplit('@').next().unwrap_or(authority))
}

/// Before credentials go anywhere (oci-client sends them to whatever token realm the
/// registry names): a realm on plain HTTP is refused unless its host is loopback or listed
/// in `insecure_registries`, the rule the registry itself is held to (E8012).
async fn check_realm(
    store: &Store,
    reference: &str,
    registry: &str,
    plain: bool,
) -> Result<(), AbxError> {
    let http = reqwest::Client::builder()
        .connect_timeout(std::time::Duration::from_secs(15))
        .timeout(std::time::Duration::from_secs(60))
        .build()
        .map_err(AbxError::internal)?;
    let url = format!("{}://{registry}/v2/", if plain { "http" } else { "https" });
    let res = http
        .get(&url)
        .send()
        .await
        .map_err(|e| unreachable(reference, e))?;
    let Some(realm) = res
        .headers()
        .get_all(reqwest::header::WWW_AUTHENTICATE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .find_map(bearer_realm)
    else {
        return Ok(());
    };
    match plain_http_host(&realm) {
        Some(host) if !is_loopback(host) && !store.registry.insecure.iter().any(|h| h == host) => {
            Err(AbxError::new(
                ErrorCode::Refused,
                &[
                    (
                        "detail",
                        &format!("the registry {registry} sends its credentials to the token server {host} over plain HTTP; they were not sent"),
                    ),
                    (
                        "rerun",
                        &format!("Only loopback hosts and those in [local] insecure_registries are spoken to over plain HTTP: add \"{host}\" there (config.toml) if that network is trusted, then restart the broker and retry."),
                    ),
                ],
            )
            .with_data("registry", registry))
        }
        _ => Ok(()),
    }
}

/// Whether an error is a registry's refusal for want of (good) credentials.
pub fn is_auth_error(e: &AbxError) -> bool {
    e.code == ErrorCode::SourceUnreachable && e.data.contains_key("auth")
}

fn unreachable(reference: &str, e: impl std::fmt::Display) -> AbxError {
    AbxError::new(
        ErrorCode::SourceUnreachable,
        &[("source", reference), ("detail", &e.to_string())],
    )
    .with_suggestion("Check the image name and the registry (plain HTTP is used only for loopback registries and [local] insecure_registries).")
}

fn map_err(
    reference: &str,
    registry: &str,
    from: AuthFrom,
    e: oci_client::errors::OciDistributionError,
) -> AbxError {
    use oci_client::errors::{DigestError, OciDistributionError as E};
    match e {
        // The token server's answer is not shown: it could hold what was sent to it.
        E::UnauthorizedError { .. } | E::AuthenticationFailure(_) => {
            auth_err(reference, registry, from)
        }
        E::ServerError { code: 401, .. } => auth_err(reference, registry, from),
        E::DigestError(DigestError::VerificationError { expected, actual }) => {
            super::mismatch(&expected, &actual)
        }
        E::ImageManifestNotFoundError(_) => {
            AbxError::new(ErrorCode::TemplateNotFound, &[("template", reference)])
        }
        other => unreachable(reference, other),
    }
}

/// Progress of a pull: (bytes done, bytes total, what).
pub type Progress<'a> = &'a (dyn Fn(u64, u64, &str) + Send + Sync);

/// Pull `reference` into the store (blobs not stored yet are fetched) and install it.
pub async fn pull(
    store: &std::sync::Arc<Store>,
    reference: &str,
    progress: Progress<'_>,
) -> Result<Image, AbxError> {
    let r = parse_ref(reference)?;
    let registry = r.resolve_registry().to_owned();
    let plain = is_loopback(&registry) || store.registry.insecure.contains(&registry);
    let cfg = ClientConfig {
        protocol: if plain {
            ClientProtocol::HttpsExcept(vec![registry.clone()])
        } else {
            ClientProtocol::Https
        },
        platform_resolver: Some(Box::new(
            |entries: &[oci_client::manifest::ImageIndexEntry]| {
                entries
                    .iter()
                    .find(|e| {
                        e.platform
                            .as_ref()
                            .is_some_and(|p| p.os == "linux" && p.architecture == go_arch())
                    })
                    .map(|e| e.digest.clone())
            },
        )),
        connect_timeout: Some(std::time::Duration::from_secs(15)),
        read_timeout: Some(std::time::Duration::from_secs(60)),
        ..Default::default()
    };
    let client = oci_client::Client::new(cfg);
    let (auth, from) = auth_for(store, &registry);
    if from != AuthFrom::None {
        check_realm(store, reference, &registry, plain).await?;
    }
    let map_err =
        |e: oci_client::errors::OciDistributionError| map_err(reference, &registry, from, e);
    // The token exchange (oci-client keeps the token for the blobs), then the manifests by
    // our own requests, each read with a cap before it is held (issue 42: oci-client reads a
    // manifest, and an error's body, whole whatever its size).
    let token = client
        .auth(&r, &auth, oci_client::RegistryOperation::Pull)
        .await
        .map_err(map_err)?;
    let authz = match (token, &auth) {
        (Some(t), _) => Some(format!("Bearer {t}")),
        (None, RegistryAuth::Basic(u, p)) => Some(format!(
            "Basic {}",
            abx_protocol::b64::encode(format!("{u}:{p}"))
        )),
        _ => None,
    };
    let fetch_manifest = ManifestFetch {
        http: reqwest::Client::builder()
            .connect_timeout(std::time::Duration::from_secs(15))
            .read_timeout(std::time::Duration::from_secs(60))
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(AbxError::internal)?,
        base: format!(
            "{}://{}/v2/{}/manifests/",
            if plain { "http" } else { "https" },
            r.resolve_registry(),
            r.repository()
        ),
        ns: r
            .namespace()
            .map(|ns| format!("?ns={ns}"))
            .unwrap_or_default(),
        authz,
        reference,
        registry: &registry,
        from,
    };
    let first = r.digest().or(r.tag()).unwrap_or("latest");
    let (raw, mut digest) = fetch_manifest.get(first).await?;
    if let Some(want) = r.digest() {
        if want != digest {
            return Err(super::mismatch(want, &digest));
        }
    }
    let bad = |e: serde_json::Error| {
        // Where, never what (a message could quote the registry's text).
        unreachable(
            reference,
            format!(
                "its manifest is not an image manifest or index (line {}, column {})",
                e.line(),
                e.column()
            ),
        )
    };
    let manifest = match serde_json::from_slice::<oci_client::manifest::OciManifest>(&raw)
        .map_err(bad)?
    {
        oci_client::manifest::OciManifest::Image(m) => m,
        oci_client::manifest::OciManifest::ImageIndex(index) => {
            drop(raw);
            let Some(entry) = index.manifests.iter().find(|e| {
                e.platform
                    .as_ref()
                    .is_some_and(|p| p.os == "linux" && p.architecture == go_arch())
            }) else {
                return Err(unreachable(
                    reference,
                    format!("the image has no manifest for linux/{}", go_arch()),
                ));
            };
            let (raw, got) = fetch_manifest.get(&entry.digest).await?;
            if got != entry.digest {
                return Err(super::mismatch(&entry.digest, &got));
            }
            digest = got;
            match serde_json::from_slice::<oci_client::manifest::OciManifest>(&raw).map_err(bad)? {
                oci_client::manifest::OciManifest::Image(m) => m,
                oci_client::manifest::OciManifest::ImageIndex(_) => {
                    return Err(unreachable(
                        reference,
                        "its index names another index for this platform",
                    ))
                }
            }
        }
    };
    if super::digest_hex(&digest).is_none() {
        return Err(unreachable(
            reference,
            format!("unsupported manifest digest {digest}"),
        ));
    }
    let total: u64 = manifest
        .layers
        .iter()
        .map(|l| l.size.max(0) as u64)
        .sum::<u64>()
        + manifest.config.size.max(0) as u64;
    if total > store.limits.max_bytes || manifest.layers.len() as u64 > store.limits.max_entries {
        return Err(super::too_big(reference, &store.limits));
    }
    if manifest.config.size.max(0) as u64 > super::manifest::MAX_CONFIG {
        return Err(unreachable(
            reference,
            format!(
                "its config declares {} bytes, over the {} read of an image config",
                manifest.config.size,
                super::manifest::MAX_CONFIG
            ),
        ));
    }
    let mut done = 0u64;
    progress(0, total, "manifest");
    let mut blobs = vec![manifest.config.clone()];
    blobs.extend(manifest.layers.iter().cloned());
    for d in &blobs {
        if super::digest_hex(&d.digest).is_none() {
            return Err(unreachable(
                reference,
                format!("unsupported digest {}", d.digest),
            ));
        }
    }
    // Up to four blobs at a time (as docker and skopeo do); each is checked and stored on
    // its own, so a failed pull keeps the blobs that were complete.
    let fetch = |d: oci_client::manifest::OciDescriptor| {
        let client = &client;
        let r = &r;
        let map_err = &map_err;
        async move {
            if !store.has_blob(&d.digest) {
                let mut w = store.blob_writer()?;
                let mut sink = Sink {
                    w: &mut w,
                    limit: d.size.max(0) as u64,
                    err: None,
                };
                let res = client.pull_blob(r, &d, &mut sink).await;
                if let Some(e) = sink.err {
                    if e.kind() == std::io::ErrorKind::FileTooLarge {
                        return Err(unreachable(
                            reference,
                            format!(
                                "blob {} is longer than the {} bytes its manifest declares",
                                d.digest, d.size
                            ),
                        ));
                    }
                    return Err(AbxError::internal(format!(
                        "templates: writing a blob: {e}"
                    )));
                }
                res.map_err(map_err)?;
                let digest = d.digest.clone();
                store.commit_blob(w, &digest)?;
            }
            Ok::<_, AbxError>(d)
        }
    };
    {
        use futures::StreamExt;
        let mut s = futures::stream::iter(blobs.clone())
            .map(fetch)
            .buffer_unordered(4);
        while let Some(d) = s.next().await {
            let d = d?;
            done += d.size.max(0) as u64;
            progress(done, total, &d.digest);
        }
    }
    let cfg_b = store.read_blob(&manifest.config.digest, super::manifest::MAX_CONFIG)?;
    let config = ImageConfig::from_blob(&cfg_b).map_err(|e| unreachable(reference, e))?;
    let img = Image {
        name: reference.to_owned(),
        digest: digest.clone(),
        layers: manifest.layers.iter().map(|l| l.digest.clone()).collect(),
        size: total,
        pulled_at: rfc3339(now_ms() / 1000),
        source: "registry".into(),
        base: None,
        config,
    };
    store.keep_blobs(&digest, std::slice::from_ref(&manifest.config.digest));
    let mut names = vec![reference.to_owned(), r.whole()];
    names.dedup();
    if r.digest().is_none() {
        // name@digest too, so the pinned form finds it without the registry.
        names.push(format!("{}@{}", r.whole(), digest));
    }
    // Unpacking is long blocking work: off the runtime's threads.
    let (st, i2) = (store.clone(), img.clone());
    tokio::task::spawn_blocking(move || st.install(&i2, &names))
        .await
        .map_err(AbxError::internal)??;
    progress(total, total, "unpacked");
    Ok(img)
}

/// The most of a manifest or an index read from a registry (registries cap them at 4 MiB).
pub const MAX_MANIFEST_BODY: u64 = super::manifest::MAX_MANIFEST;
/// The most of an error answer's body read (it is never shown: a hostile registry could
/// echo what it was sent); the rest is not read.
pub const MAX_ERROR_BODY: u64 = 64 * 1024;

/// Manifests fetched by our own requests: each body read with a cap, counted before it is
/// held (a declared length over the cap is refused before anything is read).
struct ManifestFetch<'a> {
    http: reqwest::Client,
    /// `<scheme>://<registry>/v2/<repository>/manifests/`.
    base: String,
    /// The `?ns=` of a reference through a mirror (as oci-client asks).
    ns: String,
    /// The `Authorization` value (a bearer token from the exchange, or Basic credentials).
    authz: Option<String>,
    reference: &'a str,
    registry: &'a str,
    from: AuthFrom,
}

impl ManifestFetch<'_> {
    /// The manifest or index `what` (a tag or a digest): its bytes and their digest.
    async fn get(&self, what: &str) -> Result<(Vec<u8>, String), AbxError> {
        let mut req = self
            .http
            .get(format!("{}{what}{}", self.base, self.ns))
            .header(
                reqwest::header::ACCEPT,
                [
                    oci_client::manifest::OCI_IMAGE_MEDIA_TYPE,
                    oci_client::manifest::IMAGE_MANIFEST_MEDIA_TYPE,
                    oci_client::manifest::OCI_IMAGE_INDEX_MEDIA_TYPE,
                    oci_client::manifest::IMAGE_MANIFEST_LIST_MEDIA_TYPE,
                ]
                .join(", "),
            );
        if let Some(a) = &self.authz {
            req = req.header(reqwest::header::AUTHORIZATION, a);
        }
        let res = req
            .send()
            .await
            .map_err(|e| unreachable(self.reference, e.without_url()))?;
        let status = res.status();
        if !status.is_success() {
            // Read a little of it (nothing of it is shown), never all of it.
            let _ = read_capped(res, MAX_ERROR_BODY).await;
            return Err(match status.as_u16() {
                401 | 403 => auth_err(self.reference, self.registry, self.from),
                404 => AbxError::new(ErrorCode::TemplateNotFound, &[("template", self.reference)]),
                n => unreachable(self.reference, format!("the registry answered HTTP {n}")),
            });
        }
        let body = match read_capped(res, MAX_MANIFEST_BODY).await {
            Ok(Some(b)) => b,
            Ok(None) => {
                return Err(unreachable(
                    self.reference,
                    format!("its manifest is over {MAX_MANIFEST_BODY} bytes (not read)"),
                ))
            }
            Err(e) => return Err(unreachable(self.reference, e.without_url())),
        };
        let digest = super::sha256_digest(&body);
        Ok((body, digest))
    }
}

/// At most `cap` bytes of a response's body, counted before they are read: `None` when it
/// declares more, or sends more (the rest is never read).
async fn read_capped(
    mut res: reqwest::Response,
    cap: u64,
) -> Result<Option<Vec<u8>>, reqwest::Error> {
    if res.content_length().is_some_and(|n| n > cap) {
        return Ok(None);
    }
    let mut body = Vec::with_capacity(res.content_length().unwrap_or(0).min(cap) as usize);
    while let Some(chunk) = res.chunk().await? {
        if body.len() as u64 + chunk.len() as u64 > cap {
            return Ok(None);
        }
        body.extend_from_slice(&chunk);
    }
    Ok(Some(body))
}

/// Where a blob being pulled goes; never more than `limit` bytes (its declared size).
struct Sink<'a> {
    w: &'a mut super::BlobWriter,
    limit: u64,
    err: Option<std::io::Error>,
}

impl tokio::io::AsyncWrite for Sink<'_> {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        let r = if self.w.len + buf.len() as u64 > self.limit {
            Err(std::io::Error::from(std::io::ErrorKind::FileTooLarge))
        } else {
            self.w.write(buf)
        };
        if let Err(e) = r {
            let k = e.kind();
            self.err = Some(e);
            return std::task::Poll::Ready(Err(k.into()));
        }
        std::task::Poll::Ready(Ok(buf.len()))
    }
    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }
    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pulled_blob_is_never_written_past_its_declared_size() {
        use tokio::io::AsyncWriteExt;
        let t = tempfile::tempdir().unwrap();
        let store = Store::new(t.path(), None, Default::default());
        let mut w = store.blob_writer().unwrap();
        let mut sink = Sink {
            w: &mut w,
            limit: 8,
            err: None,
        };
        futures::executor::block_on(async {
            sink.write_all(b"12345678").await.unwrap();
            let e = sink.write_all(b"9").await.unwrap_err();
            assert_eq!(e.kind(), std::io::ErrorKind::FileTooLarge);
        });
        assert!(sink.err.is_some());
        assert_eq!(w.len, 8);
    }

    #[test]
    fn credential_errors_say_where_credentials_go_and_are_told_apart() {
        for (from, state) in [
            (AuthFrom::None, "required"),
            (AuthFrom::BrokerConfig, "refused"),
            (AuthFrom::DockerConfig, "refused"),
        ] {
            let e = auth_err("127.0.0.1:5000/a/b:1", "127.0.0.1:5000", from);
            assert_eq!(e.code, ErrorCode::SourceUnreachable);
            assert!(is_auth_error(&e));
            assert_eq!(e.data["auth"], state);
            assert!(e
                .suggestion
                .contains("[local.registry_auth] \"127.0.0.1:5000\""));
            assert!(e.suggestion.contains("auths.\"127.0.0.1:5000\".auth"));
        }
        assert!(!is_auth_error(&unreachable("x", "connection refused")));
    }

    #[test]
    fn bearer_realms_and_plain_http_hosts_are_read() {
        assert_eq!(
            bearer_realm(r#"Bearer realm="http://auth.example:5001/token",service="reg""#)
                .as_deref(),
            Some("http://auth.example:5001/token")
        );
        assert_eq!(bearer_realm(r#"Basic realm="x""#), None);
        assert_eq!(
            plain_http_host("http://u@auth.example:5001/token?x=1"),
            Some("auth.example:5001")
        );
        assert_eq!(plain_http_host("HTTP://127.0.0.1/t"), Some("127.0.0.1"));
        assert_eq!(plain_http_host("https://auth.example/token"), None);
    }

    #[test]
    fn loopback_registries_are_recognised() {
        for r in [
            "127.0.0.1:5000",
            "127.3.4.5",
            "localhost:80",
            "[::1]:5000",
            "localhost",
        ] {
            assert!(is_loopback(r), "{r}");
        }
        for r in [
            "docker.io",
            "10.0.0.1:5000",
            "registry.example:5000",
            "localhost.evil",
        ] {
            assert!(!is_loopback(r), "{r}");
        }
    }
}
