//! The dnspath container image, built offline with buildah from `scratch`: the release
//! binary and exactly the shared libraries and loader `ldd` names for it. Used by
//! `cargo xtask image` and the deploy tests; the `Dockerfile` builds the same image for
//! people with a registry.
//!
//! podman and buildah run with a `containers.conf` of our own (`CONTAINERS_CONF`), never
//! the machine's: `default_ulimits = []` because raising rlimits fails without
//! CAP_SYS_RESOURCE, and runc because crun refuses the hybrid cgroup layout
//! (docs/lab.md, "Containers on these machines").
use std::{
    path::{Path, PathBuf},
    process::{Command, Output, Stdio},
};

/// Repository of the image; tagged `:<version>` and `:latest`.
pub const IMAGE: &str = "localhost/dnspath";
/// Where the binary sits in the image (the entry point).
pub const BINARY_IN_IMAGE: &str = "/usr/local/bin/dnspath";
/// Label holding the SHA-256 of the binary in the image: an image is rebuilt only when
/// the binary changed.
pub const BINARY_HASH_LABEL: &str = "io.dnspath.binary-sha256";
/// Label saying how the image was put together; bump [`RECIPE`] when [`fill`] changes, so
/// that images of an unchanged binary are rebuilt too.
const RECIPE_LABEL: &str = "io.dnspath.image-recipe";
const RECIPE: &str = "2";

const CONTAINERS_CONF: &str =
    "[containers]\ndefault_ulimits = []\n\n[engine]\nruntime = \"runc\"\n";

/// Why the image could not be built or inspected: one line.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ImageError(String);

/// A built image: `localhost/dnspath:<version>`, also tagged `:latest`.
#[derive(Debug, Clone)]
pub struct Image {
    pub reference: String,
    pub version: String,
    pub binary_sha256: String,
    /// False when an image of this very binary already existed.
    pub built: bool,
}

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."))
}

/// Writes our `containers.conf` (under `target/`) and returns its path.
pub fn containers_conf() -> Result<PathBuf, ImageError> {
    let dir = workspace_root().join("target/containers");
    std::fs::create_dir_all(&dir)
        .map_err(|e| ImageError(format!("creating {}: {e}", dir.display())))?;
    let path = dir.join("containers.conf");
    if std::fs::read_to_string(&path).ok().as_deref() != Some(CONTAINERS_CONF) {
        std::fs::write(&path, CONTAINERS_CONF)
            .map_err(|e| ImageError(format!("writing {}: {e}", path.display())))?;
    }
    Ok(path)
}

/// `podman` with our containers.conf.
pub fn podman() -> Result<Command, ImageError> {
    tool("podman")
}

/// `buildah` with our containers.conf.
pub fn buildah() -> Result<Command, ImageError> {
    tool("buildah")
}

fn tool(prog: &str) -> Result<Command, ImageError> {
    let conf = containers_conf()?;
    let mut c = Command::new(prog);
    // conmon may leave an `oom` file in its working directory when a container's cgroup
    // goes away (cgroup v1): keep it out of the source tree.
    if let Some(dir) = conf.parent() {
        c.current_dir(dir);
    }
    c.env("CONTAINERS_CONF", conf).stdin(Stdio::null());
    Ok(c)
}

fn describe(cmd: &Command) -> String {
    std::iter::once(cmd.get_program())
        .chain(cmd.get_args())
        .map(|a| a.to_string_lossy().into_owned())
        .collect::<Vec<_>>()
        .join(" ")
}

/// Runs `cmd`; its stdout if it exited 0, else a one-line error with its stderr.
pub fn output(cmd: &mut Command) -> Result<String, ImageError> {
    let what = describe(cmd);
    let o: Output = cmd.output().map_err(|e| {
        ImageError(if e.kind() == std::io::ErrorKind::NotFound {
            format!("`{what}`: not installed (`cargo xtask setup` installs podman, buildah, runc and catatonit)")
        } else {
            format!("`{what}`: {e}")
        })
    })?;
    if o.status.success() {
        Ok(String::from_utf8_lossy(&o.stdout).into_owned())
    } else {
        Err(ImageError(format!(
            "`{what}` failed ({}): {}",
            o.status,
            String::from_utf8_lossy(&o.stderr).trim()
        )))
    }
}

/// Version the binary reports (`dnspath 0.1.0` → `0.1.0`).
fn binary_version(bin: &Path) -> Result<String, ImageError> {
    let out = output(Command::new(bin).arg("--version"))?;
    out.split_whitespace()
        .nth(1)
        .map(str::to_owned)
        .ok_or_else(|| ImageError(format!("{} --version said {out:?}", bin.display())))
}

fn sha256(path: &Path) -> Result<String, ImageError> {
    let out = output(Command::new("sha256sum").arg(path))?;
    out.split_whitespace()
        .next()
        .map(str::to_owned)
        .ok_or_else(|| ImageError(format!("sha256sum {}: no digest", path.display())))
}

/// The shared objects `ldd` lists for `bin`, as paths the loader looks them up by
/// (the vDSO, which lives in the kernel, left out).
pub fn shared_libraries(bin: &Path) -> Result<Vec<PathBuf>, ImageError> {
    let out = output(Command::new("ldd").arg(bin))?;
    if out.contains("not a dynamic executable") || out.contains("statically linked") {
        return Ok(Vec::new());
    }
    let mut libs = Vec::new();
    for line in out.lines() {
        let line = line.trim();
        if line.contains("not found") {
            return Err(ImageError(format!("ldd {}: {line}", bin.display())));
        }
        // `libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x...)` or
        // `/lib64/ld-linux-x86-64.so.2 (0x...)`; `linux-vdso.so.1 (0x...)` has no path.
        let path = match line.split_once("=>") {
            Some((_, rest)) => rest.trim(),
            None => line,
        };
        let path = path.split(" (").next().unwrap_or("").trim();
        if path.starts_with('/') {
            libs.push(PathBuf::from(path));
        }
    }
    Ok(libs)
}

/// The image `reference` names now: its ID, and the binary's hash it records if it was
/// made by this recipe.
fn current_image(reference: &str) -> Result<Option<(String, Option<String>)>, ImageError> {
    let mut inspect = podman()?;
    inspect.args(["image", "inspect", reference]);
    let Ok(json) = output(&mut inspect) else {
        return Ok(None);
    };
    let v: serde_json::Value = serde_json::from_str(&json)
        .map_err(|e| ImageError(format!("podman image inspect {reference}: {e}")))?;
    let id = v[0]["Id"].as_str().unwrap_or_default().to_owned();
    let labels = &v[0]["Labels"];
    let hash = (labels[RECIPE_LABEL] == RECIPE)
        .then(|| labels[BINARY_HASH_LABEL].as_str().map(str::to_owned))
        .flatten();
    Ok(Some((id, hash)))
}

/// Builds `localhost/dnspath:<version>` (and `:latest`) holding `bin`, unless an image of
/// this very binary exists already.
pub fn ensure(bin: &Path) -> Result<Image, ImageError> {
    let bin = bin.canonicalize().map_err(|e| {
        ImageError(format!(
            "{}: {e} (build it: cargo xtask build)",
            bin.display()
        ))
    })?;
    let version = binary_version(&bin)?;
    let binary_sha256 = sha256(&bin)?;
    let reference = format!("{IMAGE}:{version}");
    let latest = format!("{IMAGE}:latest");
    let current = current_image(&reference)?;
    let previous_latest = current_image(&latest)?.map(|(id, _)| id);
    let built = current.as_ref().and_then(|(_, h)| h.as_deref()) != Some(binary_sha256.as_str());
    if built {
        build(&bin, &reference, &version, &binary_sha256)?;
    }
    output(buildah()?.args(["tag", &reference, &latest]))?;
    if built {
        // The images this one replaced, now untagged; kept if anything still uses or
        // names them.
        for old in current.map(|(id, _)| id).into_iter().chain(previous_latest) {
            if let Ok(mut rmi) = podman() {
                let _ = rmi.args(["rmi", &old]).output();
            }
        }
    }
    Ok(Image {
        reference,
        version,
        binary_sha256,
        built,
    })
}

fn build(bin: &Path, reference: &str, version: &str, hash: &str) -> Result<(), ImageError> {
    let libs = shared_libraries(bin)?;
    let name = format!("dnspath-image-{}", std::process::id());
    let ctr = output(buildah()?.args(["from", "--name", &name, "scratch"]))?
        .trim()
        .to_owned();
    let result = fill(&ctr, bin, &libs, version, hash)
        .and_then(|()| output(buildah()?.args(["commit", "--quiet", &ctr, reference])).map(|_| ()));
    // The working container is ours alone, whatever happened above.
    if let Ok(mut rm) = buildah() {
        let _ = rm.args(["rm", &ctr]).output();
    }
    result
}

fn fill(
    ctr: &str,
    bin: &Path,
    libs: &[PathBuf],
    version: &str,
    hash: &str,
) -> Result<(), ImageError> {
    let copy = |src: &Path, dest: &Path| -> Result<(), ImageError> {
        // The file itself, not a symlink to a file the image lacks
        // (/lib64/ld-linux-x86-64.so.2 is one).
        let real = src
            .canonicalize()
            .map_err(|e| ImageError(format!("{}: {e}", src.display())))?;
        let mut c = buildah()?;
        c.arg("copy").arg("--quiet").arg(ctr).arg(&real).arg(dest);
        output(&mut c).map(|_| ())
    };
    copy(bin, Path::new(BINARY_IN_IMAGE))?;
    for lib in libs {
        copy(lib, lib)?;
    }
    let entrypoint = format!("[\"{BINARY_IN_IMAGE}\"]");
    output(buildah()?.args([
        "config",
        "--entrypoint",
        &entrypoint,
        "--cmd",
        "",
        // `kubectl debug ... -- dnspath trace` replaces the entry point and looks the
        // command up in PATH, which a scratch image does not set.
        "--env",
        "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "--label",
        &format!("{RECIPE_LABEL}={RECIPE}"),
        "--label",
        &format!("{BINARY_HASH_LABEL}={hash}"),
        "--label",
        &format!("org.opencontainers.image.version={version}"),
        "--label",
        "org.opencontainers.image.title=dnspath",
        "--label",
        "org.opencontainers.image.description=eBPF DNS path tracer for Kubernetes nodes",
        ctr,
    ]))
    .map(|_| ())
}
