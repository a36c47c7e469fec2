use super::error::verifier_reason;
use super::*;

/// The line a person needs is the verifier's last complaint, not its statistics.
#[test]
fn verifier_reason_is_the_last_complaint() {
    let log = "func#0 @0\n0: R1=ctx() R10=fp0\n; let cap = ...\n\
               412: (85) call bpf_skb_load_bytes#26\n\
               R4 min value is negative, either use unsigned or 'var &= const'\n\
               processed 388 insns (limit 1000000) max_states_per_insn 1 total_states 30 peak_states 30 mark_read 12\n\
               -- END PROG LOAD LOG --\n";
    assert_eq!(
        verifier_reason(log),
        "R4 min value is negative, either use unsigned or 'var &= const'"
    );
    assert_eq!(verifier_reason(""), "(empty verifier log)");
    let e = KernelError::Rejected {
        program: "dnspath_tc_eth_ingress",
        release: "6.1.0-57-amd64".into(),
        last: verifier_reason(log),
        log: Some(PathBuf::from(
            "/tmp/dnspath-verifier-dnspath_tc_eth_ingress.log",
        )),
    };
    let line = e.to_string();
    assert!(!line.contains('\n'), "{line}");
    assert_eq!(
        line,
        "Linux 6.1.0-57-amd64 rejected eBPF program dnspath_tc_eth_ingress: R4 min value is \
         negative, either use unsigned or 'var &= const' (full verifier log: \
         /tmp/dnspath-verifier-dnspath_tc_eth_ingress.log)"
    );
    // A rejection is never mistaken for missing root.
    assert!(!is_eperm(&e));
}

/// Loads every program through the verifier and reads the counters back.
#[test]
fn programs_pass_the_verifier() {
    if !crate::test_support::root_or_skip("loading eBPF programs") {
        return;
    }
    let probes = Probes::load(&ProbeOptions {
        ports: vec![53],
        snaplen: tracer_common::MAX_SNAPLEN,
        drops: true,
        kernel_log: false,
    })
    .unwrap();
    assert!(probes.drops_enabled);
    let c = probes.counters().unwrap();
    assert_eq!(c.len(), counter::COUNT as usize);
}
