//! The JSON of images, as untrusted input: a `docker save` archive's `manifest.json`, an OCI
//! layout's `index.json`, image manifests and indexes, image configs.
//!
//! Each is read into typed structs that keep only what the store uses (unknown members are
//! skipped without being kept), every list capped ([`Capped`]), from bytes the caller read
//! with a cap ([`MAX_MANIFEST`], [`MAX_CONFIG`]): no `Value` tree of untrusted size. Errors
//! say what kind of problem and where (line, column), never the document's text: serde's own
//! messages quote values (`invalid type: string "..."`), and a "manifest" may be any file.
//!
//! Pure code (std, serde, serde_json): the fuzz crate compiles this file as it is.

use serde::de::{self, Deserializer, IgnoredAny, SeqAccess, Visitor};
use serde::Deserialize;
use std::fmt;
use std::marker::PhantomData;

/// The largest manifest, index or `manifest.json` read (registries cap manifests at 4 MiB).
pub const MAX_MANIFEST: u64 = 4 << 20;
/// The largest image config read.
pub const MAX_CONFIG: u64 = 8 << 20;
/// The most layers (or index entries) of one image.
pub const MAX_LAYERS: usize = 4096;
/// The most strings of one list of a config (`Env`, `Cmd`, `Entrypoint`).
pub const MAX_STRINGS: usize = 65536;

const CAP_MESSAGE: &str = "a list longer than this broker reads";

/// A list of at most `N` elements: refused at the first one past that, before it is kept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Capped<T, const N: usize>(pub Vec<T>);

impl<T, const N: usize> Default for Capped<T, N> {
    fn default() -> Self {
        Capped(Vec::new())
    }
}

impl<'de, T: Deserialize<'de>, const N: usize> Deserialize<'de> for Capped<T, N> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<T, const N: usize>(PhantomData<T>);
        impl<'de, T: Deserialize<'de>, const N: usize> Visitor<'de> for V<T, N> {
            type Value = Capped<T, N>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                write!(f, "a list")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                let mut v = Vec::new();
                while let Some(x) = seq.next_element()? {
                    if v.len() >= N {
                        return Err(de::Error::custom(CAP_MESSAGE));
                    }
                    v.push(x);
                }
                Ok(Capped(v))
            }
        }
        d.deserialize_seq(V::<T, N>(PhantomData))
    }
}

/// The first element of a list (the others are read past, not kept).
#[derive(Debug)]
pub struct First<T>(pub Option<T>);

impl<'de, T: Deserialize<'de>> Deserialize<'de> for First<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<T>(PhantomData<T>);
        impl<'de, T: Deserialize<'de>> Visitor<'de> for V<T> {
            type Value = First<T>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                write!(f, "a list")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                let first = seq.next_element()?;
                while seq.next_element::<IgnoredAny>()?.is_some() {}
                Ok(First(first))
            }
        }
        d.deserialize_seq(V::<T>(PhantomData))
    }
}

/// An image of a `docker save` archive (the first entry of its `manifest.json`).
#[derive(Debug, Deserialize)]
pub struct DockerSaveImage {
    /// The config's path in the archive.
    #[serde(rename = "Config")]
    pub config: String,
    /// Its tags.
    #[serde(rename = "RepoTags", default)]
    pub repo_tags: Option<Capped<String, MAX_LAYERS>>,
    /// Its layers' paths in the archive, lowest first.
    #[serde(rename = "Layers", default)]
    pub layers: Capped<String, MAX_LAYERS>,
}

/// A content descriptor.
#[derive(Debug, Clone, Deserialize, Default)]
pub struct Descriptor {
    /// `sha256:<hex>`.
    #[serde(default)]
    pub digest: String,
    /// Bytes.
    #[serde(default)]
    pub size: i64,
    /// For an index entry: the platform it is for.
    #[serde(default)]
    pub platform: Option<Platform>,
    /// For an index entry of a layout: its annotations.
    #[serde(default)]
    pub annotations: Option<Annotations>,
}

impl Descriptor {
    /// The size, none when negative.
    pub fn size(&self) -> u64 {
        self.size.max(0) as u64
    }

    /// Its `org.opencontainers.image.ref.name` annotation.
    pub fn ref_name(&self) -> Option<&str> {
        self.annotations.as_ref()?.ref_name.as_deref()
    }
}

/// The annotations the store reads.
#[derive(Debug, Clone, Deserialize, Default)]
pub struct Annotations {
    /// The tag of an image in a layout.
    #[serde(rename = "org.opencontainers.image.ref.name", default)]
    pub ref_name: Option<String>,
}

/// A platform.
#[derive(Debug, Clone, Deserialize, Default)]
pub struct Platform {
    /// `linux`.
    #[serde(default)]
    pub os: String,
    /// `amd64`, `arm64`, ...
    #[serde(default)]
    pub architecture: String,
}

/// An image manifest, or an index (`manifests`) of them.
#[derive(Debug, Deserialize, Default)]
pub struct Manifest {
    /// An index's entries.
    #[serde(default)]
    pub manifests: Option<Capped<Descriptor, MAX_LAYERS>>,
    /// The config.
    #[serde(default)]
    pub config: Option<Descriptor>,
    /// The layers, lowest first.
    #[serde(default)]
    pub layers: Capped<Descriptor, MAX_LAYERS>,
}

impl Manifest {
    /// The entry of an index for `os`/`arch`.
    pub fn platform(&self, os: &str, arch: &str) -> Option<&Descriptor> {
        self.manifests.as_ref()?.0.iter().find(|e| {
            e.platform
                .as_ref()
                .is_some_and(|p| p.os == os && p.architecture == arch)
        })
    }
}

/// The members of an image config's `config` the store honours.
#[derive(Debug, Deserialize, Default)]
pub struct RunConfig {
    /// `Env`.
    #[serde(rename = "Env", default)]
    pub env: Option<Capped<String, MAX_STRINGS>>,
    /// `WorkingDir`.
    #[serde(rename = "WorkingDir", default)]
    pub working_dir: Option<String>,
    /// `User`.
    #[serde(rename = "User", default)]
    pub user: Option<String>,
    /// `Entrypoint`.
    #[serde(rename = "Entrypoint", default)]
    pub entrypoint: Option<Capped<String, MAX_STRINGS>>,
    /// `Cmd`.
    #[serde(rename = "Cmd", default)]
    pub cmd: Option<Capped<String, MAX_STRINGS>>,
}

/// `rootfs` of an image config.
#[derive(Debug, Deserialize, Default)]
pub struct RootFs {
    /// The sha256 of each uncompressed layer.
    #[serde(default)]
    pub diff_ids: Capped<String, MAX_LAYERS>,
}

/// An image config.
#[derive(Debug, Deserialize, Default)]
pub struct Config {
    /// `config` (OCI).
    #[serde(default)]
    pub config: Option<RunConfig>,
    /// `Config` (older Docker configs).
    #[serde(rename = "Config", default)]
    pub docker_config: Option<RunConfig>,
    /// `rootfs`.
    #[serde(default)]
    pub rootfs: Option<RootFs>,
}

impl Config {
    /// `config`, else `Config`.
    pub fn run(&self) -> Option<&RunConfig> {
        self.config.as_ref().or(self.docker_config.as_ref())
    }

    /// `rootfs.diff_ids`.
    pub fn diff_ids(&self) -> &[String] {
        self.rootfs.as_ref().map_or(&[], |r| &r.diff_ids.0)
    }
}

/// Why a document was refused: a kind of problem and where, nothing of its text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JsonError(pub String);

impl fmt::Display for JsonError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for JsonError {}

fn parse<'a, T: Deserialize<'a>>(b: &'a [u8]) -> Result<T, JsonError> {
    serde_json::from_slice(b).map_err(|e| {
        use serde_json::error::Category;
        let what = match e.classify() {
            // Our own message (a list over its cap) carries no input.
            Category::Data if e.to_string().starts_with(CAP_MESSAGE) => CAP_MESSAGE,
            Category::Data => "not the expected JSON structure",
            Category::Syntax => "not valid JSON",
            Category::Eof => "JSON that ends too soon",
            Category::Io => "unreadable JSON",
        };
        JsonError(format!("{what} at line {} column {}", e.line(), e.column()))
    })
}

/// The first image of a `docker save` archive's `manifest.json`.
pub fn docker_save(b: &[u8]) -> Result<DockerSaveImage, JsonError> {
    parse::<First<DockerSaveImage>>(b)?
        .0
        .ok_or_else(|| JsonError("manifest.json lists no image".into()))
}

/// An OCI layout's `index.json`, an image index or an image manifest.
pub fn manifest(b: &[u8]) -> Result<Manifest, JsonError> {
    parse(b)
}

/// An image config.
pub fn config(b: &[u8]) -> Result<Config, JsonError> {
    parse(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn documents_are_read() {
        let d = docker_save(
            br#"[{"Config":"c.json","RepoTags":["a:1"],"Layers":["l/layer.tar"]},{"Config":7}]"#,
        )
        .unwrap();
        assert_eq!(d.config, "c.json");
        assert_eq!(d.layers.0, ["l/layer.tar"]);
        let m = manifest(
            br#"{"schemaVersion":2,"manifests":[{"digest":"sha256:1","size":3,"platform":{"os":"linux","architecture":"arm64"}},
              {"digest":"sha256:2","platform":{"os":"linux","architecture":"amd64"},"annotations":{"org.opencontainers.image.ref.name":"v1","x":"y"}}]}"#,
        )
        .unwrap();
        assert_eq!(m.platform("linux", "amd64").unwrap().digest, "sha256:2");
        assert_eq!(m.platform("linux", "amd64").unwrap().ref_name(), Some("v1"));
        let c = config(br#"{"config":{"Env":["A=1"],"WorkingDir":"/w","Cmd":null},"rootfs":{"diff_ids":["sha256:x"]},"history":[{"a":1}]}"#).unwrap();
        assert_eq!(c.run().unwrap().env.as_ref().unwrap().0, ["A=1"]);
        assert_eq!(c.diff_ids(), ["sha256:x"]);
    }

    #[test]
    fn errors_say_where_and_never_quote() {
        for b in [
            &br#"{"manifests":"SECRET"}"#[..],
            br#"{"config":{"Env":"SECRET"}}"#,
            br#"{"config":{"Env":["A", 1]}, "SECRET": 1}"#,
            br#"[{"Config":["SECRET"]}]"#,
            b"root:SECRET:19700:0:99999:7:::",
            br#"{"manifests":[{"digest":"SECRET"#,
        ] {
            let e = manifest(b)
                .err()
                .or_else(|| config(b).err())
                .or_else(|| docker_save(b).err())
                .map(|e| e.to_string())
                .unwrap_or_default();
            assert!(!e.contains("SECRET"), "{e}");
        }
        let e = config(br#"{"config":{"Env":"SECRET"}}"#).unwrap_err();
        assert_eq!(e.0, "not the expected JSON structure at line 1 column 25");
    }

    #[test]
    fn lists_are_capped_before_they_are_kept() {
        let many = format!("{{\"layers\":[{}]}}", vec!["{}"; MAX_LAYERS + 1].join(","));
        let e = manifest(many.as_bytes()).unwrap_err();
        assert!(e.0.starts_with(CAP_MESSAGE), "{e}");
        let ok = format!("{{\"layers\":[{}]}}", vec!["{}"; MAX_LAYERS].join(","));
        assert_eq!(manifest(ok.as_bytes()).unwrap().layers.0.len(), MAX_LAYERS);
    }
}
