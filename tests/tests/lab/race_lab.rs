#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "integration tests fail at the line that broke"
)]
//! The conntrack DNAT race made deterministic (LAB.md "Failure 2"): a query to the
//! ClusterIP held in an NFQUEUE after DNAT, while the same socket queries the pods
//! directly, loses its conntrack insertion (`insert_failed` +1, `drop` +1) every time.
//! Root only; `--test-threads=1`.
use std::time::{Duration, Instant};

use lab::{
    addr,
    race::{ct_stats, ct_totals, force_race, RaceRig},
    Lab, LabConfig,
};

const SHOTS: u64 = 10;
const HOLD_MS: u32 = 300;

fn dig_cluster_ip(lab: &Lab) -> String {
    let at = format!("@{}", lab.cluster_ip());
    let out = lab.dig(&["+time=2", "+tries=1", "+short", &at, "www.lab.test", "A"]);
    assert!(
        out.status.success(),
        "dig via the ClusterIP failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

#[test]
fn nfqueue_hold_forces_the_dnat_race_every_time() {
    if !lab::tracer::root_or_skip("network namespaces, iptables, NFQUEUE") {
        return;
    }
    let lab = Lab::start(LabConfig::default()).unwrap();
    let pods = lab.dns_pod_count();

    let rig = RaceRig::install(&lab, HOLD_MS).unwrap();

    // Control: a lone query to the ClusterIP is held, then released and answered, without
    // any conntrack failure. The losses below are the race, not the holder.
    let (f_ctl, d_ctl, _) = ct_totals(&ct_stats(&lab).unwrap());
    let t = Instant::now();
    assert_eq!(dig_cluster_ip(&lab), addr::WWW_A.to_string());
    let held_for = t.elapsed();
    eprintln!("control: lone A via the ClusterIP answered after {held_for:?}");
    assert!(
        held_for >= Duration::from_millis(u64::from(HOLD_MS)),
        "not held: {held_for:?}"
    );
    assert!(
        held_for < Duration::from_millis(u64::from(HOLD_MS) + 700),
        "held too long: {held_for:?}"
    );
    let (f_ctl2, d_ctl2, _) = ct_totals(&ct_stats(&lab).unwrap());
    assert_eq!((f_ctl2, d_ctl2), (f_ctl, d_ctl), "the control query raced");

    let before = ct_stats(&lab).unwrap();
    let (if0, drop0, clash0) = ct_totals(&before);
    eprintln!(
        "lab {}: {} CPU rows; before: insert_failed={if0} drop={drop0} clashres={clash0}",
        lab.prefix(),
        before.len()
    );

    let mut raced = 0;
    for i in 0..SHOTS {
        let (f_before, d_before, _) = ct_totals(&ct_stats(&lab).unwrap());
        let name = format!("race{i}.{}", addr::ZONE);
        let shot = force_race(&lab, &name).unwrap();
        let (f_after, d_after, _) = ct_totals(&ct_stats(&lab).unwrap());
        eprintln!(
            "shot {i} {name}: port {} A id {} answered={} AAAA id {} answers={} \
             insert_failed +{} drop +{} {:?}",
            shot.src_port,
            shot.a_id,
            shot.a_answered,
            shot.aaaa_id,
            shot.aaaa_answers,
            f_after - f_before,
            d_after - d_before,
            shot.answers
        );
        assert!(
            !shot.a_answered,
            "shot {i}: the held A query was answered: {shot:?}"
        );
        assert!(shot.aaaa_answered, "shot {i}: no AAAA answer: {shot:?}");
        assert_eq!(
            shot.aaaa_answers, pods,
            "shot {i}: not every pod answered: {shot:?}"
        );
        for (id, from, port, _, _) in &shot.answers {
            assert_eq!(*id, shot.aaaa_id, "shot {i}: unexpected answer {shot:?}");
            assert_eq!(*port, 53);
            assert!(
                (0..pods).any(|p| lab.ip_of(lab::Pod::Dns(p)) == *from),
                "shot {i}: answer from {from}, not a pod"
            );
        }
        if !shot.a_answered && f_after - f_before == 1 && d_after - d_before == 1 {
            raced += 1;
        }
    }

    let after = ct_stats(&lab).unwrap();
    let (if1, drop1, clash1) = ct_totals(&after);
    let per_cpu: Vec<(u64, u64, u64)> = before
        .iter()
        .zip(&after)
        .map(|(b, a)| (a.0 - b.0, a.1 - b.1, a.2 - b.2))
        .collect();
    eprintln!(
        "after {SHOTS} shots: insert_failed +{} drop +{} clashres +{}; per CPU \
         (insert_failed, drop, clashres) deltas {per_cpu:?}; raced {raced}/{SHOTS}",
        if1 - if0,
        drop1 - drop0,
        clash1 - clash0
    );
    assert_eq!(if1 - if0, SHOTS, "insert_failed delta");
    assert_eq!(drop1 - drop0, SHOTS, "drop delta");
    assert_eq!(raced, SHOTS, "LAB.md: 10 of 10 times");

    let summary = rig.remove().unwrap();
    eprintln!("holder: {summary:?}");
    assert_eq!(
        summary.held,
        SHOTS + 1,
        "the holder held the control and the A queries"
    );
    assert_eq!(summary.immediate, 0);
    assert_eq!(summary.verdict_errors, 0);

    let rules = lab.exec(
        lab.node_ns(),
        &[lab.iptables(), "-t", "nat", "-S", "POSTROUTING"],
    );
    let rules = String::from_utf8_lossy(&rules.stdout);
    assert!(!rules.contains("NFQUEUE"), "rule still there:\n{rules}");

    assert_eq!(dig_cluster_ip(&lab), addr::WWW_A.to_string());
    let (if2, drop2, _) = ct_totals(&ct_stats(&lab).unwrap());
    assert_eq!(
        (if2, drop2),
        (if1, drop1),
        "a normal query after removal raced"
    );

    // Stopping the holder accepts what it still holds: a query held for 5 s is answered as
    // soon as the rig is removed.
    let rig = RaceRig::install(&lab, 5000).unwrap();
    let at = format!("@{}", lab.cluster_ip());
    let t = Instant::now();
    let dig = lab
        .spawn_in(
            lab.client_ns(),
            &[
                "dig",
                "+time=8",
                "+tries=1",
                "+short",
                &at,
                "www.lab.test",
                "A",
            ],
        )
        .unwrap();
    std::thread::sleep(Duration::from_millis(500));
    let summary = rig.remove().unwrap();
    let out = dig.wait_with_output().unwrap();
    let took = t.elapsed();
    eprintln!("held for 5 s, removed after 0.5 s: answered after {took:?}; holder: {summary:?}");
    assert_eq!(summary.released_on_exit, 1);
    assert!(out.status.success());
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        addr::WWW_A.to_string()
    );
    assert!(
        took < Duration::from_secs(3),
        "not released on exit: {took:?}"
    );
}
