//! Builds the eBPF programs of `tracer-ebpf` and leaves the object in OUT_DIR, where
//! `src/ebpf.rs` embeds it (aya-template layout).
//!
//! Toolchain choice (docs/toolchain.md): a rustup `nightly` with `rust-src` builds the usual
//! way (`-Z build-std=core`); otherwise the `debian-bpf` toolchain (Debian's rustc-web with a
//! prebuilt `core` for bpfel, linked by `cargo xtask setup`) builds without build-std.
use std::{path::Path, process::Command};

use anyhow::{anyhow, Context as _};
use aya_build::{Package, Toolchain};

fn nightly_has_rust_src() -> bool {
    let Ok(out) = Command::new("rustup")
        .args(["run", "nightly", "rustc", "--print", "sysroot"])
        .output()
    else {
        return false;
    };
    let sysroot = String::from_utf8_lossy(&out.stdout).trim().to_string();
    out.status.success()
        && Path::new(&sysroot)
            .join("lib/rustlib/src/rust/library/core")
            .is_dir()
}

fn toolchain_exists(name: &str) -> bool {
    Command::new("rustup")
        .args(["run", name, "rustc", "--version"])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false)
}

fn main() -> anyhow::Result<()> {
    println!("cargo:rerun-if-env-changed=DNSPATH_EBPF_TOOLCHAIN");
    let metadata = cargo_metadata::MetadataCommand::new()
        .no_deps()
        .exec()
        .context("cargo metadata")?;
    // The kernel programs are built from tracer-ebpf (aya-build watches its directory) and
    // tracer-common, whose layouts they share: an edit to either rebuilds the object.
    for p in metadata
        .packages
        .iter()
        .filter(|p| p.name == "tracer-common")
    {
        if let Some(dir) = p.manifest_path.parent() {
            println!("cargo:rerun-if-changed={dir}");
        }
    }
    let ebpf = metadata
        .packages
        .into_iter()
        .find(|p| p.name == "tracer-ebpf")
        .ok_or_else(|| anyhow!("tracer-ebpf package not found"))?;
    let root_dir = ebpf
        .manifest_path
        .parent()
        .ok_or_else(|| anyhow!("tracer-ebpf manifest has no parent"))?
        .as_str()
        .to_owned();

    let forced = std::env::var("DNSPATH_EBPF_TOOLCHAIN").ok();
    let toolchain_name = match forced.as_deref() {
        Some(name) => name.to_owned(),
        None if nightly_has_rust_src() => "nightly".to_owned(),
        None if toolchain_exists("debian-bpf") => "debian-bpf".to_owned(),
        None => {
            return Err(anyhow!(
                "no eBPF toolchain: neither a rustup nightly with rust-src nor the `debian-bpf` \
                 toolchain exists; run `cargo xtask setup`"
            ))
        }
    };
    println!("cargo:warning=building eBPF programs with the `{toolchain_name}` toolchain");
    let toolchain = if toolchain_name == "nightly" {
        Toolchain::Nightly
    } else {
        Toolchain::Custom(&toolchain_name)
    };
    aya_build::build_ebpf(
        [Package {
            name: "tracer-ebpf",
            root_dir: &root_dir,
            ..Default::default()
        }],
        toolchain,
    )
}
