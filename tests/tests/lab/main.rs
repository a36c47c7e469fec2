//! The lab integration tests, one binary: a module a subject (`cargo test -p dnspath-tests
//! --test lab -- loops::` runs one). Root only; `--test-threads=1`, since they share the
//! kernel's state. `golden` and `kernel_matrix` (run by name in VMs) stay binaries of their own.
//!
//! Writing a test: it goes in the module of its subject (a new subject is a new module
//! here); it starts with `let Some(lab) = lab() else { return };` (`shared`: skipped, not
//! passed, without root when `DNSPATH_SKIP_ROOT_TESTS=1`), runs `dnspath` through
//! `lab::tracer::Tracer` and real clients in the lab's namespaces, and asserts on the NDJSON
//! records. A helper a second module needs moves to `shared.rs`; the lab itself (pods,
//! servers, kube-proxy's rules) is the `lab` library in `tests/src`.
//!
//! The binary runs in namespaces of its own ([`lab::sandbox`]): two runs of it at once
//! (two filters, two worktrees) do not see each other's labs.
mod agent;
mod alerts;
mod analyze;
mod attach;
mod conntrack;
mod dashboards;
mod deploy;
mod doctor;
mod evidence;
mod exits;
mod fragments;
mod hostile;
mod loops;
mod otlp;
mod pod_proxy;
mod pods;
mod prog_test_run;
mod race_lab;
mod races;
mod shared;
mod slow_reader;
mod top;
mod trace;
mod transactions;
mod tunnels;

/// Before `main`, while the process has one thread: namespaces of its own.
#[ctor::ctor(unsafe)]
fn own_namespaces() {
    lab::sandbox::enter();
}
