//! `cargo xtask image`: the release binary as a container image, built offline with
//! buildah (`lab::image`, shared with the deploy tests): `localhost/dnspath:<version>` and
//! `:latest`. Rebuilt only when the binary changed.
use crate::Result;
use anyhow::anyhow;

pub fn run() -> Result<()> {
    let bin = crate::build::build_release()?;
    let image = lab::image::ensure(&bin).map_err(|e| anyhow!("{e}"))?;
    eprintln!(
        "xtask: {} (and {}:latest) {}, binary sha256 {}",
        image.reference,
        lab::image::IMAGE,
        if image.built {
            "built"
        } else {
            "already up to date"
        },
        image.binary_sha256
    );
    Ok(())
}
