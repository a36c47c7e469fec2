//! Helpers of the unit tests.

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
