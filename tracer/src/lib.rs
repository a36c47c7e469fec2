pub mod ebpf;
