//! The `proxy` binary: `run`, `inspect`, `trace`, `cleanup`.

use proxy::cli::Command;

/// See `proxy::allocator` for why.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

mod cmd;

fn main() -> anyhow::Result<()> {
    proxy::allocator::configure();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = proxy::cli::parse_from(std::env::args_os()).unwrap_or_else(|e| e.exit());
    match cli.command {
        Command::Run(args) => {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()?;
            rt.block_on(cmd::run::run(*args))
        }
        Command::Inspect(args) => cmd::inspect::run(&args),
        Command::Trace(args) => cmd::trace::run(&args),
        Command::Cleanup(args) => cmd::cleanup::run(&args),
    }
}
