//! Logging through tracing: a file under the data dir and (optionally) stderr. Never stdout,
//! which belongs to the stdio transport.

use abx_home::Paths;
use tracing_subscriber::{fmt, layer::SubscriberExt, util::SubscriberInitExt, EnvFilter, Layer};

/// Keeps the file writer flushing; hold it for the life of the process.
pub struct LogGuard(#[allow(dead_code)] Option<tracing_appender::non_blocking::WorkerGuard>);

/// Install the global subscriber. `ABX_LOG` sets the filter (default `info`). The registry
/// client's debug lines are never enabled, whatever `ABX_LOG` says: they hold the bearer
/// tokens a token server answered (secrets, like the credentials they were got with).
pub fn init(paths: &Paths, to_stderr: bool) -> LogGuard {
    let filter = || {
        EnvFilter::try_from_env("ABX_LOG")
            .unwrap_or_else(|_| EnvFilter::new("info"))
            .add_directive("oci_client=info".parse().expect("directive"))
    };
    let (file_layer, guard) = match std::fs::create_dir_all(&paths.log_dir) {
        Ok(()) => {
            let appender = tracing_appender::rolling::never(&paths.log_dir, "broker.log");
            // A small line buffer: the default (128k lines) preallocates 4 MiB, 40% of the
            // idle daemon's memory bar.
            let (nb, guard) = tracing_appender::non_blocking::NonBlockingBuilder::default()
                .buffered_lines_limit(4096)
                .finish(appender);
            let layer = fmt::layer()
                .with_writer(nb)
                .with_ansi(false)
                .with_filter(filter());
            (Some(layer), Some(guard))
        }
        Err(_) => (None, None),
    };
    let stderr_layer = to_stderr.then(|| {
        fmt::layer()
            .with_writer(std::io::stderr)
            .with_ansi(false)
            .with_filter(filter())
    });
    let _ = tracing_subscriber::registry()
        .with(file_layer)
        .with(stderr_layer)
        .try_init();
    LogGuard(guard)
}
