//! `outbox-relay`: run the relay, migrate the table, show the lag, or generate load.

use std::process::ExitCode;

// glibc's malloc took about a quarter of the relay's CPU at full speed (perf, realistic
// workload): every batch allocates and frees hundreds of payload buffers, frames and futures
// across threads. See docs/benchmarks.md, item 8.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    outbox_relay::cli::main()
}
