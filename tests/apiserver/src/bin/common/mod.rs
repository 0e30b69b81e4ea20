//! What the measuring binaries (`bench`, `latency`) share.

use std::path::PathBuf;
use std::process::Command;

/// Builds cmpoll in release mode (quietly, incrementally) and returns its path.
pub fn release_cmpoll() -> PathBuf {
    // Another build to run instead (a `--profile profiling` one, for `perf`).
    if let Some(bin) = std::env::var_os("CMPOLL_BENCH_BIN") {
        return PathBuf::from(bin).canonicalize().expect("CMPOLL_BENCH_BIN");
    }
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let status = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .args(["build", "--release", "--quiet", "-p", "cmpoll"])
        .current_dir(&root)
        .status()
        .expect("cargo");
    assert!(status.success(), "cargo build --release -p cmpoll");
    // Where cargo put it: `CARGO_TARGET_DIR` when set (a worktree's own), else the repo's.
    let target =
        std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| root.join("target"), PathBuf::from);
    target.join("release/cmpoll").canonicalize().unwrap()
}
