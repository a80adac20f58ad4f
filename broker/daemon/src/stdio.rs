//! `abx broker --stdio`: a private broker serving one client on stdin/stdout.

use crate::{logging, Paths};
use abx_core::conn::{self, ConnEnd};

/// Serve stdin/stdout until the client closes stdin or sends `exit`.
pub fn run(paths: Paths) -> std::io::Result<()> {
    abx_confine::fds::cloexec_inherited_fds();
    crate::tune_allocator();
    let _log = logging::init(&paths, true);
    abx_local::procs::announce_weaker_model();
    let rt = crate::compose::runtime()?;
    rt.block_on(async move {
        let broker = crate::compose::broker(paths);
        tracing::info!(version = %broker.version, "stdio broker started");
        let end = conn::serve(broker.clone(), tokio::io::stdin(), tokio::io::stdout()).await;
        tracing::info!(?end, "stdio broker done");
        let _: ConnEnd = end;
    });
    rt.shutdown_timeout(std::time::Duration::from_millis(100));
    Ok(())
}
