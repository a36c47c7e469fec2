//! deploy/alerts.yaml is valid (`promtool check rules`) and its unit tests pass
//! (`promtool test rules deploy/alerts_test.yaml`: each alert fires when it should and stays
//! quiet when it should not). Needs promtool (Debian package `prometheus`, installed by
//! `cargo xtask setup`); without it this test fails rather than pass untested.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "integration tests fail at the line that broke"
)]
use std::process::{Command, Output};

use crate::shared::deploy_dir;

fn promtool(args: &[&str]) -> Output {
    match Command::new("promtool")
        .args(args)
        .current_dir(deploy_dir())
        .output()
    {
        Ok(out) => out,
        Err(e) => panic!(
            "cannot run promtool ({e}): it checks deploy/alerts.yaml; `cargo xtask setup` \
             installs it (Debian package prometheus), or `apt-get install prometheus`"
        ),
    }
}

fn assert_ok(what: &str, out: &Output) {
    assert!(
        out.status.success(),
        "promtool {what} failed ({}):\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn alert_rules_are_valid() {
    let out = promtool(&["check", "rules", "alerts.yaml"]);
    assert_ok("check rules alerts.yaml", &out);
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("SUCCESS: 7 rules found"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}

#[test]
fn alert_unit_tests_pass() {
    let out = promtool(&["test", "rules", "alerts_test.yaml"]);
    assert_ok("test rules alerts_test.yaml", &out);
}
