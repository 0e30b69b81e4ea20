//! The one module allowed `unsafe`: glibc's `mallopt`, called once at start-up, before any
//! thread exists.
//!
//! glibc serves a block of 128 KiB or more from its own mapping, given back to the system
//! when freed, but it raises that threshold to the size of every such block freed (up to
//! 32 MiB). cmpoll's large blocks come and go once per poll (a poll's entries, a first
//! batch's events, the output folder's record), so after the first poll they would land in
//! the heap, where freed space stays resident and the next poll's blocks do not fit.
//! Measured at 100,000 ConfigMaps (README, "Performance"): peak RSS of the daemon 65 → 42
//! MiB with stdout events, 121 → 98 MiB with `--out-dir`. Fixing the threshold keeps large
//! blocks in their own mappings. A user who tunes malloc (`GLIBC_TUNABLES`,
//! `MALLOC_MMAP_THRESHOLD_`) keeps their setting.
#![allow(unsafe_code)]

/// The threshold glibc starts with.
const THRESHOLD: i32 = 128 * 1024;

/// Fixes glibc's mmap threshold, unless `env` shows the user tuning malloc.
pub fn tune(env: &dyn Fn(&str) -> Option<String>) {
    if !user_tuned(env) {
        set_mmap_threshold(THRESHOLD);
    }
}

fn user_tuned(env: &dyn Fn(&str) -> Option<String>) -> bool {
    env("MALLOC_MMAP_THRESHOLD_").is_some()
        || env("GLIBC_TUNABLES").is_some_and(|t| t.contains("glibc.malloc."))
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn set_mmap_threshold(bytes: i32) {
    // glibc's malloc.h.
    const M_MMAP_THRESHOLD: i32 = -3;
    unsafe extern "C" {
        fn mallopt(param: i32, value: i32) -> i32;
    }
    // SAFETY: mallopt only sets a parameter of the allocator (it returns 0 on a bad
    // value, which leaves the default); it is called before any other thread runs.
    let _ = unsafe { mallopt(M_MMAP_THRESHOLD, bytes) };
}

/// Other C libraries (musl) give large blocks back on their own.
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn set_mmap_threshold(_bytes: i32) {}

#[cfg(test)]
mod tests {
    #[test]
    fn a_users_malloc_settings_win() {
        for (vars, tuned) in [
            (&[][..], false),
            (&[("GLIBC_TUNABLES", "glibc.rtld.nns=2")][..], false),
            (&[("GLIBC_TUNABLES", "glibc.malloc.arena_max=2")][..], true),
            (&[("MALLOC_MMAP_THRESHOLD_", "65536")][..], true),
        ] {
            let env = |k: &str| {
                vars.iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| v.to_string())
            };
            assert_eq!(super::user_tuned(&env), tuned, "{vars:?}");
        }
    }
}
