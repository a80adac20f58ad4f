//! `templates/build` of a Dockerfile (issue 49): a context directory on this machine built
//! into an image of the store, rootless, with no daemon but the broker.
//!
//! - [`parse`]: the Dockerfile (directives, continuations, exec form, expansion).
//! - [`context`]: `COPY` / `ADD` sources read through descriptors, `.dockerignore`, the
//!   context's caps; the layer they make.
//! - [`cache`]: step key -> the image the step made.
//! - [`build`]: the engine: stages in dependency order (a cycle is E2012), each instruction
//!   a step; `RUN` in a `local` sandbox made from the step's image ([`Runner`], served by
//!   the provider), its upper layer captured under the same rule as a saved sandbox (the
//!   sandbox stopped, the layer read through descriptors).
//!
//! Every step that changes the file system makes an image of its own (`source: "step"`,
//! no name, not in `templates/list`): its layers are its parent's and one more, its root the
//! parent's hard-link clone with the layer applied. `ENV`, `ARG`, `USER`, `LABEL`, `EXPOSE`,
//! `CMD`, `ENTRYPOINT`, `SHELL` change the config only (an empty layer in docker's terms).
//! Cancelling the request removes every image and cache entry the build made.

pub mod build;
pub mod cache;
pub mod context;
pub mod parse;

use super::{Image, ImageConfig};
use abx_core::provider::BoxFut;
use abx_protocol::AbxError;
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::PathBuf;
use tokio_util::sync::CancellationToken;

/// `Image::source` of a build step.
pub const STEP_SOURCE: &str = "step";

/// A Dockerfile build as asked.
#[derive(Clone, Debug)]
pub struct Request {
    /// The context directory (absolute).
    pub context: PathBuf,
    /// The Dockerfile, relative to the context.
    pub dockerfile: String,
    /// The image's name.
    pub name: String,
    /// `ARG` values.
    pub build_args: BTreeMap<String, String>,
    /// The stage to build (default: the last).
    pub target: Option<String>,
    /// The `RUN` steps' network (sandbox/create's `network`).
    pub network: Value,
    /// Run every step (results still recorded in the cache).
    pub no_cache: bool,
}

/// One `RUN`: a command in a sandbox made from `image`.
pub struct RunStep {
    /// The image to run on (its root, its `User`).
    pub image: Image,
    /// The program and its arguments.
    pub argv: Vec<String>,
    /// The environment (over the image's).
    pub env: BTreeMap<String, String>,
    /// The working directory (absolute).
    pub cwd: String,
    /// The network.
    pub network: Value,
    /// The config of the image the step makes.
    pub config: ImageConfig,
}

/// What a `RUN` did.
pub enum RunOutcome {
    /// It exited 0: the image it made (its layer on `image`).
    Done(Box<Image>),
    /// It exited non-zero (or was killed: 128 + signal).
    Failed(i32),
}

/// Where `RUN` steps run: the `local` provider's sandboxes.
pub trait Runner: Send + Sync {
    /// Run `step` in a fresh sandbox, each output line to `out`; stopped when `cancel`
    /// fires (then an error). The sandbox is gone when this returns.
    fn run_step<'a>(
        &'a self,
        step: RunStep,
        out: &'a (dyn Fn(String) + Send + Sync),
        cancel: &'a CancellationToken,
    ) -> BoxFut<'a, Result<RunOutcome, AbxError>>;
}

/// `templates/build` of a Dockerfile: the build runs in a task of its own holding the
/// store's lock, so that a cancelled request (whose future is dropped) still stops it and
/// removes what it made before the lock is let go; progress goes to `conn` in order, before
/// the reply.
pub async fn serve(
    store: std::sync::Arc<super::Store>,
    runner: std::sync::Arc<dyn Runner>,
    req: Request,
    conn: abx_core::outbound::Outbound,
) -> Result<Value, AbxError> {
    let cancel = CancellationToken::new();
    let _stop = cancel.clone().drop_guard();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<build::Event>();
    let name = req.name.clone();
    let fwd = tokio::spawn(async move {
        while let Some(e) = rx.recv().await {
            let p = abx_protocol::api::TemplatesProgress {
                template: name.clone(),
                bytes: e.done,
                total: e.total,
                step: e.step,
                line: e.line,
                cached: e.cached,
            };
            conn.notify("templates/progress", &p).await;
        }
    });
    let task = tokio::spawn(async move {
        let _g = store.lock.lock().await;
        let progress = move |e: build::Event| {
            let _ = tx.send(e);
        };
        build::build(&store, &*runner, &req, &progress, &cancel).await
    });
    let res = task.await.map_err(AbxError::internal)?;
    let _ = fwd.await;
    let img = res?;
    Ok(img.view(std::slice::from_ref(&img.name)))
}

/// The Dockerfile form's params, checked.
pub fn request(p: &abx_protocol::api::TemplatesBuildParams) -> Result<Request, AbxError> {
    let bad = |m: String| AbxError::invalid_params("templates/build", m);
    if p.sandbox.is_some() {
        return Err(bad(
            "give either sandbox (save a sandbox) or context (build a Dockerfile), not both".into(),
        ));
    }
    let context = PathBuf::from(p.context.clone().unwrap_or_default());
    if !context.is_absolute() {
        return Err(bad(
            "context must be an absolute directory on the broker's machine".into(),
        ));
    }
    let name = p
        .name
        .clone()
        .filter(|n| !n.is_empty())
        .ok_or_else(|| bad("missing field `name`".into()))?;
    if name == super::HOST_TEMPLATE || name.contains('@') || name.starts_with("sha256:") {
        return Err(bad(format!("'{name}' cannot name a template")));
    }
    let dockerfile = p
        .dockerfile
        .clone()
        .filter(|d| !d.is_empty())
        .unwrap_or_else(|| "Dockerfile".into());
    Ok(Request {
        context,
        dockerfile,
        name,
        build_args: p.build_args.clone().unwrap_or_default(),
        target: p.target.clone().filter(|t| !t.is_empty()),
        network: p
            .network
            .clone()
            .unwrap_or_else(|| Value::String("none".into())),
        no_cache: p.no_cache == Some(true),
    })
}
