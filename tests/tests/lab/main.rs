//! The lab integration tests, one binary: a module a subject (`cargo test -p dnspath-tests
//! --test lab -- loops::` runs one). Root only; `--test-threads=1`, since they share the
//! kernel's state. `golden` and `kernel_matrix` (run by name in VMs) stay binaries of their own.
mod agent;
mod alerts;
mod analyze;
mod attach;
mod conntrack;
mod deploy;
mod doctor;
mod evidence;
mod exits;
mod fragments;
mod hostile;
mod loops;
mod otlp;
mod pods;
mod prog_test_run;
mod race_lab;
mod races;
mod slow_reader;
mod trace;
mod transactions;
mod tunnels;
