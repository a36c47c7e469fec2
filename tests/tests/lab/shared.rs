//! Helpers more than one module of the lab tests uses, written once.
use std::path::{Path, PathBuf};

use lab::{
    tracer::{dnspath_bin, require_tools, root_or_skip},
    DnsPodConfig, DnsServerKind, Lab, LabConfig,
};
use serde_json::Value;

/// A lab of `cfg` for a test that runs `dnspath`, or `None` when root tests are skipped
/// ([`root_or_skip`]); fails the test if the binary is not built.
pub fn lab_of(cfg: LabConfig) -> Option<Lab> {
    if !root_or_skip("network namespaces, eBPF") {
        return None;
    }
    assert!(
        dnspath_bin().exists(),
        "dnspath binary missing at {}; run `cargo xtask test`",
        dnspath_bin().display()
    );
    match Lab::start(cfg) {
        Ok(lab) => Some(lab),
        Err(e) => panic!("lab: {e}"),
    }
}

/// [`lab_of`] the default lab.
pub fn lab() -> Option<Lab> {
    lab_of(LabConfig::default())
}

/// [`lab`], for a test that also needs `tools` on PATH (it fails without them: a test must
/// not pass without running).
pub fn lab_with_tools(tools: &[&str]) -> Option<Lab> {
    if !root_or_skip("network namespaces, eBPF") {
        return None;
    }
    require_tools(tools);
    lab()
}

/// The records of type `t` (`packet`, `transaction`, …).
pub fn of_type<'a>(recs: &'a [Value], t: &str) -> Vec<&'a Value> {
    recs.iter().filter(|r| r["type"] == t).collect()
}

/// A record's first question's name.
pub fn qname(r: &Value) -> Option<&str> {
    r["dns"]["questions"][0]["name"].as_str()
}

/// `dig ARGS` from the lab's client, which must succeed; its standard output.
pub fn dig_ok(lab: &Lab, args: &[&str]) -> String {
    let out = lab.dig(args);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "dig {args:?} failed: {stdout}");
    stdout
}

/// A dnsdist pod forwarding to the cluster DNS Service: a forwarding loop as soon as a
/// question it cannot answer comes.
pub fn dnsdist_to_cluster_ip() -> DnsPodConfig {
    DnsPodConfig::new(DnsServerKind::Dnsdist).forwarding_to_cluster_ip()
}

/// The repository's `deploy/` folder.
pub fn deploy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy")
}
