//! The `RUN` steps of a Dockerfile build, served by the `local` provider (a child module of
//! `sandboxes.rs`, declared there with `#[path]`, so it sees the sandboxes' insides): each
//! step runs in a sandbox of its own made from the step's image (the same containment as
//! any sandbox: namespaces, Landlock, seccomp, cgroup, the network the build asked for),
//! its output read line by line, its upper layer captured as `templates/build` of a sandbox
//! does (the cgroup frozen, else its processes stopped; the layer read through descriptors
//! only), then the sandbox is killed, whatever happened.

use super::{exec, layer_dirs, Inner};
use crate::templates::dockerfile::{RunOutcome, RunStep, Runner};
use abx_core::provider::BoxFut;
use abx_protocol::api::SandboxCreateParams;
use abx_protocol::{AbxError, ErrorCode};
use serde_json::json;
use std::time::Duration;
use tokio::io::AsyncBufReadExt;
use tokio_util::sync::CancellationToken;

/// The longest output line passed on (longer ones are cut).
const MAX_LINE: usize = 8 * 1024;
/// How long output is still read after the command exits (children may hold the pipes).
const DRAIN_GRACE: Duration = Duration::from_millis(250);
/// A step's sandbox lives at most this long.
const STEP_TIMEOUT_S: u64 = 24 * 3600;

impl Runner for Inner {
    fn run_step<'a>(
        &'a self,
        step: RunStep,
        out: &'a (dyn Fn(String) + Send + Sync),
        cancel: &'a CancellationToken,
    ) -> BoxFut<'a, Result<RunOutcome, AbxError>> {
        Box::pin(async move {
            let v = self
                .create(SandboxCreateParams {
                    template: Some(step.image.digest.clone()),
                    network: Some(step.network.clone()),
                    timeout: Some(json!(STEP_TIMEOUT_S)),
                    ..Default::default()
                })
                .await?;
            let id = v["id"].as_str().unwrap_or_default().to_owned();
            let r = self.run_in(&id, &step, out, cancel).await;
            self.kill(&id).await;
            r
        })
    }
}

impl Inner {
    async fn run_in(
        &self,
        id: &str,
        step: &RunStep,
        out: &(dyn Fn(String) + Send + Sync),
        cancel: &CancellationToken,
    ) -> Result<RunOutcome, AbxError> {
        let sb = self.get(id)?;
        let parts = sb.exec_parts().await?;
        let p = exec::ExecParams {
            sandbox: id.to_owned(),
            argv: Some(step.argv.clone()),
            cwd: Some(step.cwd.clone()),
            env: Some(step.env.clone()),
            ..Default::default()
        };
        let mut sp = exec::spawn(parts.site(&sb, id), &p, false).await?;
        let _tree = exec::TreeGuard(sp.pid, true);
        let read = |r: Option<Box<dyn tokio::io::AsyncRead + Send + Unpin>>| async move {
            let Some(r) = r else { return };
            let mut br = tokio::io::BufReader::new(r);
            let mut buf = Vec::new();
            loop {
                buf.clear();
                match br.read_until(b'\n', &mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {
                        while buf.last().is_some_and(|c| *c == b'\n' || *c == b'\r') {
                            buf.pop();
                        }
                        buf.truncate(MAX_LINE);
                        out(String::from_utf8_lossy(&buf).into_owned());
                    }
                }
            }
        };
        let pump = futures::future::join(read(sp.stdout.take()), read(sp.stderr.take()));
        tokio::pin!(pump);
        let mut status = None;
        let mut drained = false;
        loop {
            tokio::select! {
                s = sp.child.wait(), if status.is_none() => {
                    status = Some(s.map_err(|e| AbxError::internal(format!("waiting for a RUN step: {e}")))?);
                }
                _ = &mut pump, if !drained => drained = true,
                _ = cancel.cancelled() => return Err(AbxError::new(ErrorCode::RequestCancelled, &[])),
                _ = tokio::time::sleep(DRAIN_GRACE), if status.is_some() => break,
            }
            if status.is_some() && drained {
                break;
            }
        }
        let status = status.expect("waited");
        use std::os::unix::process::ExitStatusExt;
        let code = status
            .code()
            .unwrap_or_else(|| 128 + status.signal().unwrap_or(0));
        if code != 0 {
            return Ok(RunOutcome::Failed(code));
        }
        let copy = sb
            .rec
            .lock()
            .expect("record")
            .image
            .as_ref()
            .is_some_and(|i| i.copy);
        if copy {
            return Err(AbxError::detail(
                ErrorCode::SandboxCreateFailed,
                "this machine refused overlayfs for the step's sandbox: a RUN step's layer cannot be told from its image",
            ));
        }
        // Stopped while its layer is read (see templates::build): frozen, else each process.
        let cg = sb.cgroup.lock().expect("cgroup").clone();
        let frozen = cg.as_ref().is_some_and(|c| c.freeze(true));
        let pidns = match sb.container.lock().await.clone() {
            Some(c) if !frozen => Some(c.pidns()),
            _ => None,
        };
        let upper = layer_dirs(&sb.dirs).0;
        let store = self.templates.clone();
        let parent = step.image.clone();
        let config = step.config.clone();
        let res = tokio::task::spawn_blocking(move || {
            store.step_from_upper(&parent, &upper, pidns, &config)
        })
        .await
        .map_err(AbxError::internal);
        if let (true, Some(c)) = (frozen, &cg) {
            c.freeze(false);
        }
        Ok(RunOutcome::Done(Box::new(res??)))
    }
}
