//! Helpers of the unit tests; [`fixtures`]: records as the pipeline makes them.

pub(crate) mod fixtures;

/// Whether a unit test that needs root (`why`) may run. Without root it must not pass as if
/// it had run: it fails, saying how to run it, unless `DNSPATH_SKIP_ROOT_TESTS=1` asks to
/// skip such tests, which then say so (`SKIPPED`) and return `false` (as the lab tests'
/// `root_or_skip` does).
pub(crate) fn root_or_skip(why: &str) -> bool {
    if nix::unistd::geteuid().is_root() {
        return true;
    }
    if std::env::var_os("DNSPATH_SKIP_ROOT_TESTS").is_some_and(|v| v == "1") {
        eprintln!("SKIPPED: needs root ({why}); DNSPATH_SKIP_ROOT_TESTS=1");
        return false;
    }
    panic!(
        "this test needs root ({why}): run it as root, or set DNSPATH_SKIP_ROOT_TESTS=1 to \
         skip the tests that need it"
    );
}

/// Runs a tool a test needs (`conntrack`, `nft`, `ip`); `false` (said: `SKIPPED`) when it
/// is not installed, so the test can say it did not run; a failure of the tool fails the
/// test with its stderr.
pub(crate) fn tool(name: &str, args: &[&str]) -> bool {
    match std::process::Command::new(name).args(args).output() {
        Ok(o) => {
            assert!(
                o.status.success(),
                "{name} {args:?}: {}",
                String::from_utf8_lossy(&o.stderr)
            );
            true
        }
        Err(e) => {
            eprintln!("SKIPPED: {name} not runnable: {e}");
            false
        }
    }
}

/// Conntrack statistics of `netns` at `ts`: CPU 1 with `insert_failed` (and `drop`) and
/// `clash_resolve` at the given totals, CPU 0 with none.
pub(crate) fn ct_sample(
    ts: u64,
    netns: u64,
    insert_failed: u64,
    clash_resolve: u64,
) -> crate::event::CtStatsSample {
    use crate::event::{CtCpuStats, CtStatsSample};
    CtStatsSample {
        ts_ns: ts,
        netns,
        per_cpu: vec![
            CtCpuStats {
                cpu: 0,
                ..Default::default()
            },
            CtCpuStats {
                cpu: 1,
                insert_failed,
                drop: insert_failed,
                clash_resolve,
                ..Default::default()
            },
        ],
    }
}
