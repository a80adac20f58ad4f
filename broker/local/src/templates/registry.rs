//! Pulling images from an OCI / Docker registry v2, by the daemon's own requests (`oci-client`
//! gives the reference grammar and the manifest types; issue 42: it read token answers, and
//! every body, whole).
//!
//! HTTPS everywhere except registries on loopback addresses (`127.0.0.0/8`, `::1`,
//! `localhost`, as Docker does) and those listed in `[local] insecure_registries`; the same
//! rule holds for the token realm a registry names and for where it redirects a blob.
//! Credentials: `[local.registry_auth]` of the broker config, else `auths.<registry>.auth` of
//! `$DOCKER_CONFIG/config.json` or `~/.docker/config.json` (base64 `user:password`), else
//! anonymous. The registry's challenge on `/v2/` (`WWW-Authenticate`, at most 8 KiB a value,
//! read by [`challenges`]) decides: Bearer, the token exchange with the realm it names (the
//! credentials, when there are some, sent there as Basic; the answer read at most 64 KiB,
//! `token` or `access_token`), else HTTP Basic to the registry itself. A realm may be on
//! another host (Docker Hub's is), but only over http(s), plain HTTP only to a loopback or
//! insecure host (E8012 otherwise, before anything is sent), never redirected. Credentials and
//! tokens are never logged or returned: a registry or token server that refuses them is E8010
//! with `data.auth` (`required` or `refused`) and a suggestion naming where credentials go,
//! nothing of what the servers answered (a hostile one could echo them). Every answer is read
//! with a cap before it is held: manifests 4 MiB, token answers and error pages 64 KiB (an
//! error page is never shown, only its status); a blob is streamed to a temp file, never past
//! the size its manifest declares, hashed while it is written and stored only when it matches
//! its digest (E8013 otherwise). Blob redirects (registries hand blobs to a CDN) are followed
//! by hand, at most 5, each checked like a realm; the registry's `Authorization` goes only to
//! the registry's own origin. A descriptor's `urls` (foreign layers) are never fetched. An
//! index is resolved to the manifest of `linux` and the host's architecture.

use super::{BlobWriter, Image, ImageConfig, Store};
use abx_home::util::{now_ms, rfc3339};
use abx_protocol::{AbxError, ErrorCode};
use oci_client::Reference;
use reqwest::header::{HeaderValue, AUTHORIZATION, LOCATION, WWW_AUTHENTICATE};
use reqwest::Url;
use std::net::IpAddr;
use std::time::Duration;

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

/// The `Authorization: Basic` value of a user and password, marked sensitive (never in a
/// debug line of the HTTP client).
fn basic(user: &str, password: &str) -> Result<HeaderValue, AbxError> {
    let mut v = HeaderValue::try_from(format!(
        "Basic {}",
        abx_protocol::b64::encode(format!("{user}:{password}"))
    ))
    .map_err(|_| AbxError::internal("templates: credentials that are no header value"))?;
    v.set_sensitive(true);
    Ok(v)
}

/// The registry's credentials (as an `Authorization: Basic` value) and where they came from.
fn auth_for(store: &Store, registry: &str) -> Result<(Option<HeaderValue>, AuthFrom), AbxError> {
    if let Some((u, p)) = store.registry.auth.get(registry) {
        return Ok((Some(basic(u, p)?), AuthFrom::BrokerConfig));
    }
    Ok(match docker_config_auth(registry) {
        Some((u, p)) => (Some(basic(&u, &p)?), AuthFrom::DockerConfig),
        None => (None, AuthFrom::None),
    })
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

/// The most of one `WWW-Authenticate` value read; a longer one is ignored whole.
pub const MAX_CHALLENGE: usize = 8 * 1024;

/// One challenge of a `WWW-Authenticate` value: its scheme and its parameters (names in
/// lower case, quoted values unquoted).
#[derive(Debug, PartialEq, Eq)]
struct Challenge {
    scheme: String,
    params: Vec<(String, String)>,
}

impl Challenge {
    fn param(&self, name: &str) -> Option<&str> {
        self.params
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

/// The challenges of a `WWW-Authenticate` value (RFC 9110 11.6.1: `scheme param=value,
/// param="quoted \" value", other-scheme ...`), read in one pass over at most
/// [`MAX_CHALLENGE`] bytes. A value longer than that, or one that breaks the grammar
/// (an unclosed quote, a parameter before any scheme), gives none.
fn challenges(v: &str) -> Vec<Challenge> {
    fn parse(v: &str) -> Option<Vec<Challenge>> {
        let b = v.as_bytes();
        let tchar = |c: u8| c.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&c);
        let skip_ws = |i: &mut usize| {
            while *i < b.len() && matches!(b[*i], b' ' | b'\t') {
                *i += 1;
            }
        };
        let mut out: Vec<Challenge> = Vec::new();
        let mut i = 0;
        loop {
            while i < b.len() && matches!(b[i], b' ' | b'\t' | b',') {
                i += 1;
            }
            if i == b.len() {
                return Some(out);
            }
            let start = i;
            while i < b.len() && tchar(b[i]) {
                i += 1;
            }
            if i == start {
                return None;
            }
            let name = &v[start..i];
            let mut j = i;
            skip_ws(&mut j);
            if j < b.len() && b[j] == b'=' {
                // A parameter of the challenge being read.
                let last = out.last_mut()?;
                i = j + 1;
                skip_ws(&mut i);
                let mut value = Vec::new();
                if i < b.len() && b[i] == b'"' {
                    i += 1;
                    loop {
                        match *b.get(i)? {
                            b'"' => break,
                            b'\\' => {
                                i += 1;
                                value.push(*b.get(i)?);
                            }
                            c => value.push(c),
                        }
                        i += 1;
                    }
                    i += 1;
                } else {
                    while i < b.len() && !matches!(b[i], b',' | b' ' | b'\t') {
                        value.push(b[i]);
                        i += 1;
                    }
                }
                // Bytes of a `str` cut only at ASCII: still UTF-8.
                let value = String::from_utf8(value).ok()?;
                last.params.push((name.to_ascii_lowercase(), value));
            } else {
                out.push(Challenge {
                    scheme: name.to_owned(),
                    params: Vec::new(),
                });
            }
        }
    }
    if v.len() > MAX_CHALLENGE {
        return Vec::new();
    }
    parse(v).unwrap_or_default()
}

/// The `host[:port]` of a URL, as `insecure_registries` lists hosts.
fn authority(u: &Url) -> String {
    let host = u.host_str().unwrap_or("");
    match u.port() {
        Some(p) => format!("{host}:{p}"),
        None => host.to_owned(),
    }
}

/// The most of a token server's answer read (a token is a few KiB): a longer answer is
/// refused, one declaring more before anything of it is read.
pub const MAX_TOKEN_BODY: u64 = 64 * 1024;
/// The most redirects of a blob request followed.
pub const MAX_REDIRECTS: usize = 5;

/// What a token server answers (distribution's token spec: `token`, or OAuth2's
/// `access_token`; Docker takes `access_token` when both are there).
#[derive(serde::Deserialize)]
struct TokenAnswer {
    token: Option<String>,
    access_token: Option<String>,
}

/// The daemon's requests to one registry for one image: every answer read with a cap,
/// counted before it is held (a declared length over the cap is refused before anything
/// is read).
struct Remote<'a> {
    http: reqwest::Client,
    /// `<scheme>://<registry>/v2/`.
    v2: String,
    /// `<scheme>://<registry>/v2/<repository>/`.
    base: String,
    /// The `?ns=` of a reference through a mirror (as oci-client asks).
    ns: String,
    /// The `Authorization` value (a bearer token from the exchange, or Basic credentials).
    authz: Option<HeaderValue>,
    store: &'a Store,
    reference: &'a str,
    registry: &'a str,
    repository: &'a str,
    from: AuthFrom,
}

impl Remote<'_> {
    /// Whether the daemon may speak to `url`: https, or plain http to a loopback host or one
    /// of `insecure_registries` (E8012 otherwise, naming the host, before anything is sent).
    fn may_reach(&self, url: &Url, what: &str) -> Result<(), AbxError> {
        match url.scheme() {
            "https" => Ok(()),
            "http" => {
                let host = authority(url);
                if is_loopback(&host) || self.store.registry.insecure.contains(&host) {
                    return Ok(());
                }
                Err(AbxError::new(
                    ErrorCode::Refused,
                    &[
                        (
                            "detail",
                            &format!("the registry {} names {what} {host} on plain HTTP; nothing was sent there{}", self.registry,
                                if self.from == AuthFrom::None { "" } else { " (its credentials were not sent)" }),
                        ),
                        (
                            "rerun",
                            &format!("Only loopback hosts and those in [local] insecure_registries are spoken to over plain HTTP: add \"{host}\" there (config.toml) if that network is trusted, then restart the broker and retry."),
                        ),
                    ],
                )
                .with_data("registry", self.registry))
            }
            _ => Err(unreachable(
                self.reference,
                format!("{what} is not an http(s) URL (nothing was sent there)"),
            )),
        }
    }

    /// The `Authorization` to pull with, from the registry's challenge on `/v2/`: a token
    /// from the Bearer realm it names (asked with `creds` when there are some), else `creds`
    /// as HTTP Basic, else none.
    async fn authorize(&self, creds: Option<HeaderValue>) -> Result<Option<HeaderValue>, AbxError> {
        let res = self
            .http
            .get(&self.v2)
            .timeout(Duration::from_secs(60))
            .send()
            .await
            .map_err(|e| unreachable(self.reference, e.without_url()))?;
        let bearer = res
            .headers()
            .get_all(WWW_AUTHENTICATE)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(challenges)
            .find(|c| c.scheme.eq_ignore_ascii_case("bearer") && c.param("realm").is_some());
        // Its body is never read.
        drop(res);
        let Some(bearer) = bearer else {
            return Ok(creds);
        };
        let realm = bearer.param("realm").unwrap_or_default();
        let Ok(mut realm) = Url::parse(realm) else {
            return Err(unreachable(
                self.reference,
                "its token realm is not a URL (nothing was sent there)",
            ));
        };
        self.may_reach(&realm, "the token server")?;
        // Credentials go in the header, never in the URL.
        let _ = realm.set_username("");
        let _ = realm.set_password(None);
        realm.set_fragment(None);
        realm
            .query_pairs_mut()
            .append_pair("scope", &format!("repository:{}:pull", self.repository));
        if let Some(service) = bearer.param("service") {
            realm.query_pairs_mut().append_pair("service", service);
        }
        let mut req = self.http.get(realm).timeout(Duration::from_secs(60));
        if let Some(c) = creds {
            req = req.header(AUTHORIZATION, c);
        }
        let mut res = req
            .send()
            .await
            .map_err(|e| unreachable(self.reference, e.without_url()))?;
        let status = res.status();
        if !status.is_success() {
            // Read a little of it (nothing of it is shown: it could echo what was sent).
            let _ = read_capped(&mut res, MAX_ERROR_BODY).await;
            return Err(match status.as_u16() {
                401 | 403 => auth_err(self.reference, self.registry, self.from),
                n => unreachable(
                    self.reference,
                    format!("its token server answered HTTP {n}"),
                ),
            });
        }
        let body = match read_capped(&mut res, MAX_TOKEN_BODY).await {
            Ok(Some(b)) => b,
            Ok(None) => {
                return Err(unreachable(
                    self.reference,
                    format!("its token server's answer is over {MAX_TOKEN_BODY} bytes (not read)"),
                ))
            }
            Err(e) => return Err(unreachable(self.reference, e.without_url())),
        };
        let answer: TokenAnswer = serde_json::from_slice(&body).map_err(|e| {
            // Where, never what (the answer holds the token).
            unreachable(
                self.reference,
                format!(
                    "its token server's answer is not a token (line {}, column {})",
                    e.line(),
                    e.column()
                ),
            )
        })?;
        drop(body);
        let token = [answer.access_token, answer.token]
            .into_iter()
            .flatten()
            .find(|t| !t.is_empty())
            .ok_or_else(|| {
                unreachable(self.reference, "its token server's answer holds no token")
            })?;
        let mut v = HeaderValue::try_from(format!("Bearer {token}")).map_err(|_| {
            unreachable(
                self.reference,
                "its token server's token is not an HTTP header value",
            )
        })?;
        v.set_sensitive(true);
        Ok(Some(v))
    }

    /// The manifest or index `what` (a tag or a digest): its bytes and their digest.
    async fn manifest(&self, what: &str) -> Result<(Vec<u8>, String), AbxError> {
        let mut req = self
            .http
            .get(format!("{}manifests/{what}{}", self.base, self.ns))
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
            req = req.header(AUTHORIZATION, a.clone());
        }
        let mut res = req
            .send()
            .await
            .map_err(|e| unreachable(self.reference, e.without_url()))?;
        let status = res.status();
        if !status.is_success() {
            // Read a little of it (nothing of it is shown), never all of it.
            let _ = read_capped(&mut res, MAX_ERROR_BODY).await;
            return Err(match status.as_u16() {
                401 | 403 => auth_err(self.reference, self.registry, self.from),
                404 => AbxError::new(ErrorCode::TemplateNotFound, &[("template", self.reference)]),
                n => unreachable(self.reference, format!("the registry answered HTTP {n}")),
            });
        }
        let body = match read_capped(&mut res, MAX_MANIFEST_BODY).await {
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

    /// The blob `d` streamed into `w`, never past the size `d` declares (a declared length
    /// over it is refused before anything is read). Redirects are followed by hand (at most
    /// [`MAX_REDIRECTS`], each checked by [`Remote::may_reach`]); the `Authorization` goes
    /// only to the registry's own origin. An error page is read at most 64 KiB, never shown.
    async fn blob(
        &self,
        d: &oci_client::manifest::OciDescriptor,
        w: &mut BlobWriter,
    ) -> Result<(), AbxError> {
        let limit = d.size.max(0) as u64;
        let mut url = Url::parse(&format!("{}blobs/{}{}", self.base, d.digest, self.ns))
            .map_err(|_| unreachable(self.reference, format!("no URL for blob {}", d.digest)))?;
        let origin = url.origin();
        let mut hops = 0;
        let (own, mut res) = loop {
            let own = url.origin() == origin;
            let mut req = self.http.get(url.clone());
            if let (true, Some(a)) = (own, &self.authz) {
                req = req.header(AUTHORIZATION, a.clone());
            }
            let res = req
                .send()
                .await
                .map_err(|e| unreachable(self.reference, e.without_url()))?;
            if !res.status().is_redirection() {
                break (own, res);
            }
            hops += 1;
            let next = res
                .headers()
                .get(LOCATION)
                .and_then(|l| l.to_str().ok())
                .and_then(|l| url.join(l).ok());
            // Its body is never read.
            drop(res);
            let Some(next) = next.filter(|_| hops <= MAX_REDIRECTS) else {
                return Err(unreachable(
                    self.reference,
                    format!(
                        "the registry redirected blob {} nowhere or more than {MAX_REDIRECTS} times",
                        d.digest
                    ),
                ));
            };
            self.may_reach(&next, "a blob's location")?;
            url = next;
        };
        let status = res.status();
        if !status.is_success() {
            let _ = read_capped(&mut res, MAX_ERROR_BODY).await;
            return Err(match status.as_u16() {
                401 | 403 if own => auth_err(self.reference, self.registry, self.from),
                404 => AbxError::new(ErrorCode::TemplateNotFound, &[("template", self.reference)])
                    .with_suggestion(format!(
                        "The registry {} has the image's manifest but not its blob {}: the image is incomplete there; push it again, or pull another tag or digest.",
                        self.registry, d.digest
                    )),
                n => unreachable(
                    self.reference,
                    format!("the registry answered HTTP {n} for blob {}", d.digest),
                ),
            });
        }
        let longer = || {
            unreachable(
                self.reference,
                format!(
                    "blob {} is longer than the {} bytes its manifest declares",
                    d.digest, d.size
                ),
            )
        };
        if res.content_length().is_some_and(|n| n > limit) {
            return Err(longer());
        }
        while let Some(chunk) = res
            .chunk()
            .await
            .map_err(|e| unreachable(self.reference, e.without_url()))?
        {
            write_capped(w, limit, &chunk).map_err(|e| {
                if e.kind() == std::io::ErrorKind::FileTooLarge {
                    longer()
                } else {
                    AbxError::internal(format!("templates: writing a blob: {e}"))
                }
            })?;
        }
        Ok(())
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
    let scheme = if plain { "http" } else { "https" };
    let (creds, from) = auth_for(store, &registry)?;
    let mut remote = Remote {
        http: reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(15))
            .read_timeout(Duration::from_secs(60))
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(AbxError::internal)?,
        v2: format!("{scheme}://{registry}/v2/"),
        base: format!("{scheme}://{registry}/v2/{}/", r.repository()),
        ns: r
            .namespace()
            .map(|ns| format!("?ns={ns}"))
            .unwrap_or_default(),
        authz: None,
        store,
        reference,
        registry: &registry,
        repository: r.repository(),
        from,
    };
    // The challenge, and the token exchange when it asks for one; then the manifests and
    // the blobs, each answer read with a cap before it is held.
    remote.authz = remote.authorize(creds).await?;
    let remote = remote;
    let first = r.digest().or(r.tag()).unwrap_or("latest");
    let (raw, mut digest) = remote.manifest(first).await?;
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
            let (raw, got) = remote.manifest(&entry.digest).await?;
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
        let remote = &remote;
        async move {
            if !store.has_blob(&d.digest) {
                let mut w = store.blob_writer()?;
                remote.blob(&d, &mut w).await?;
                store.commit_blob(w, &d.digest)?;
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

/// At most `cap` bytes of a response's body, counted before they are read: `None` when it
/// declares more, or sends more (the rest is never read).
async fn read_capped(
    res: &mut reqwest::Response,
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

/// Append `buf` to a blob being pulled, never past `limit` bytes (its declared size):
/// `FileTooLarge` then, and nothing of `buf` written.
fn write_capped(w: &mut BlobWriter, limit: u64, buf: &[u8]) -> std::io::Result<()> {
    if w.len + buf.len() as u64 > limit {
        return Err(std::io::ErrorKind::FileTooLarge.into());
    }
    w.write(buf)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pulled_blob_is_never_written_past_its_declared_size() {
        let t = tempfile::tempdir().unwrap();
        let store = Store::new(t.path(), None, Default::default());
        let mut w = store.blob_writer().unwrap();
        write_capped(&mut w, 8, b"12345678").unwrap();
        let e = write_capped(&mut w, 8, b"9").unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::FileTooLarge);
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
    fn challenges_are_read_bounded_with_quoted_values_and_several_schemes() {
        let c = challenges(
            r#"Bearer realm="http://auth.example:5001/token",service="reg", scope="repository:a/b:pull""#,
        );
        assert_eq!(c.len(), 1);
        assert!(c[0].scheme.eq_ignore_ascii_case("bearer"));
        assert_eq!(c[0].param("realm"), Some("http://auth.example:5001/token"));
        assert_eq!(c[0].param("service"), Some("reg"));
        assert_eq!(c[0].param("scope"), Some("repository:a/b:pull"));
        // Two challenges in one value, a quoted comma and escapes, unquoted values.
        let c = challenges(
            r#"Basic realm="a, \"b\"", charset=UTF-8 , BEARER Realm=https://h/t,service=s"#,
        );
        assert_eq!(c.len(), 2, "{c:?}");
        assert_eq!(c[0].scheme, "Basic");
        assert_eq!(c[0].param("realm"), Some(r#"a, "b""#));
        assert_eq!(c[0].param("charset"), Some("UTF-8"));
        assert_eq!(c[1].scheme, "BEARER");
        assert_eq!(c[1].param("realm"), Some("https://h/t"));
        assert_eq!(c[1].param("service"), Some("s"));
        assert_eq!(challenges("Basic").len(), 1);
        // Broken: none at all (an unclosed quote, a parameter before any scheme, a byte
        // outside the grammar), and a value over the cap is not read.
        for bad in [
            r#"Bearer realm="http://x"#,
            r#"realm="x""#,
            "Bearer realm=\"x\", \u{1}",
            "Bearer realm=\"x\\",
        ] {
            assert!(challenges(bad).is_empty(), "{bad:?}");
        }
        let long = format!(
            r#"Bearer realm="https://h/t",service="{}""#,
            "s".repeat(MAX_CHALLENGE)
        );
        assert!(challenges(&long).is_empty());
    }

    #[test]
    fn realms_and_redirects_follow_the_plain_http_rules() {
        let t = tempfile::tempdir().unwrap();
        let settings = super::super::RegistrySettings {
            insecure: vec!["reg.lan:5000".into()],
            ..Default::default()
        };
        let store = Store::new(t.path(), None, settings);
        let remote = |from| Remote {
            http: reqwest::Client::new(),
            v2: String::new(),
            base: String::new(),
            ns: String::new(),
            authz: None,
            store: &store,
            reference: "r.example/a:1",
            registry: "r.example",
            repository: "a",
            from,
        };
        let ok = |u: &str| {
            remote(AuthFrom::DockerConfig).may_reach(&Url::parse(u).unwrap(), "the token server")
        };
        for u in [
            "https://auth.docker.io/token",
            "http://127.0.0.1:5001/token",
            "http://[::1]:5001/token",
            "http://localhost/token",
            "http://reg.lan:5000/token",
        ] {
            assert!(ok(u).is_ok(), "{u}");
        }
        for (u, code) in [
            ("http://auth.example:5001/token", ErrorCode::Refused),
            ("http://reg.lan/token", ErrorCode::Refused),
            ("http://u:p@auth.example/token", ErrorCode::Refused),
            ("ftp://auth.example/token", ErrorCode::SourceUnreachable),
            ("file:///etc/shadow", ErrorCode::SourceUnreachable),
        ] {
            let e = ok(u).unwrap_err();
            assert_eq!(e.code, code, "{u}");
            assert!(!e.message.contains("u:p"), "{e:?}");
        }
        let e = ok("http://auth.example:5001/t").unwrap_err();
        assert!(e.message.contains("auth.example:5001") && e.message.contains("credentials"));
        assert!(e.suggestion.contains("insecure_registries"));
        let e = remote(AuthFrom::None)
            .may_reach(
                &Url::parse("http://cdn.example/b").unwrap(),
                "a blob's location",
            )
            .unwrap_err();
        assert!(!e.message.contains("credentials"), "{}", e.message);
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
