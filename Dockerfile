# dnspath's container image, for people with a registry:
#
#   docker build -t REGISTRY/dnspath:0.1.0 .    # or: podman build / buildah bud
#
# Offline, on the project's machines, `cargo xtask image` builds the same image with buildah
# from scratch (the binary and the libraries ldd names for it); deploy/daemonset.yaml runs
# it. docs/deploy.md.

# Build: Debian 12 with rustup, plus what `cargo xtask setup` installs (Debian's rustc-web
# with a prebuilt core for bpfel as the `debian-bpf` toolchain, bpf-linker against LLVM 22,
# and the lab's packages). setup uses pip for kubernetes-validate; Debian's python has no
# pip of its own.
FROM docker.io/library/rust:1-bookworm AS build
RUN apt-get update -q \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends python3-pip \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
# setup, then `cargo build --release -p tracer --bin dnspath` (tracer/build.rs builds and
# embeds the eBPF object).
RUN cargo xtask build \
 && cp target/release/dnspath /dnspath \
 && ldd /dnspath

# Runtime: glibc and libgcc_s (all the binary links against, see `ldd`) and nothing else.
# No shell; the entry point is dnspath itself (`trace`, `agent`, `analyze`).
FROM gcr.io/distroless/cc-debian12 AS runtime
COPY --from=build /dnspath /usr/local/bin/dnspath
LABEL org.opencontainers.image.title="dnspath" \
      org.opencontainers.image.description="eBPF DNS path tracer for Kubernetes nodes"
# root: loading eBPF programs and entering other network namespaces take capabilities
# that deploy/daemonset.yaml lists; the image itself grants nothing.
USER 0
ENTRYPOINT ["/usr/local/bin/dnspath"]
