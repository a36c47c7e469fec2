//! Discovery against real namespaces (`ip netns`), without eBPF. Needs root; says so and
//! returns without it. Each test makes and removes namespaces of its own
//! (`dnspath-ut-PID-N`), removed by a `Drop` guard even when the test fails.
use std::{path::Path, process::Command};

use super::*;

/// Liveness, not a benchmark: well under [`SAFETY_RESCAN`], so that only an event can
/// have found the change.
const WITHIN: Duration = Duration::from_secs(2);

struct TestNetns(String);

impl TestNetns {
    fn add(n: u32) -> Self {
        let name = format!("dnspath-ut-{}-{n}", std::process::id());
        ip(&["netns", "add", &name]);
        Self(name)
    }

    fn id(&self) -> NetnsId {
        netns::id_of(&Path::new("/run/netns").join(&self.0)).unwrap()
    }
}

impl Drop for TestNetns {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.0])
            .stderr(std::process::Stdio::null())
            .status();
    }
}

fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().unwrap();
    assert!(
        out.status.success(),
        "ip {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// One test at a time: another test's namespace going away would start the discovery pass
/// that finds this one's, whether or not its own event worked.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn privileged(test: &str) -> bool {
    let ok = nix::unistd::geteuid().is_root()
        && Command::new("ip")
            .arg("-V")
            .output()
            .is_ok_and(|o| o.status.success());
    if !ok {
        eprintln!("{test}: needs root and iproute2's `ip`; not run");
    }
    ok
}

/// Turns until `want` is among what was found, or [`WITHIN`] has passed: how long it took.
fn wait_for(d: &mut Discovery, want: impl Fn(&Found) -> bool) -> Option<Duration> {
    let start = Instant::now();
    while start.elapsed() < WITHIN {
        let turn = d.turn(WITHIN.saturating_sub(start.elapsed())).unwrap();
        assert!(!turn.full, "the safety rescan ran: {turn:?}");
        if turn.found.iter().any(&want) {
            return Some(start.elapsed());
        }
    }
    None
}

fn named(name: &str) -> AttachSpec {
    AttachSpec {
        netns: vec![name.to_string()],
        ..Default::default()
    }
}

#[test]
fn namespace_made_after_start_is_found_by_event() {
    if !privileged("namespace_made_after_start_is_found_by_event") {
        return;
    }
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    // The directory must exist to be watched; `ip netns add` makes it otherwise.
    std::fs::create_dir_all("/run/netns").unwrap();
    let mut d = Discovery::new(&AttachSpec {
        all_netns: true,
        ..Default::default()
    })
    .unwrap();
    let found = d.pass(true).unwrap();
    let own = netns::own_netns().unwrap().id;
    assert!(found.contains(&Found::Appeared(own)), "{found:?}");
    let ns = TestNetns::add(1);
    let id = ns.id();
    let took = wait_for(&mut d, |f| *f == Found::Appeared(id));
    assert!(took.is_some(), "{} not found within {WITHIN:?}", ns.0);
    let w = d.get(id).unwrap();
    assert!(w.links.iter().any(|l| l.name == "lo"), "{:?}", w.links);
    assert_ne!(w.cookie, d.get(own).unwrap().cookie);
}

#[test]
fn interface_added_in_known_namespace_is_seen() {
    if !privileged("interface_added_in_known_namespace_is_seen") {
        return;
    }
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let ns = TestNetns::add(2);
    let id = ns.id();
    let mut d = Discovery::new(&named(&ns.0)).unwrap();
    let found = d.pass(true).unwrap();
    assert!(found.contains(&Found::Appeared(id)), "{found:?}");
    assert_eq!(d.get(id).unwrap().links.len(), 1, "only lo at first");
    ip(&[
        "-n", &ns.0, "link", "add", "ut-a", "type", "veth", "peer", "name", "ut-b",
    ]);
    let took = wait_for(&mut d, |f| *f == Found::Relinked(id));
    assert!(
        took.is_some(),
        "veth in {} not seen within {WITHIN:?}",
        ns.0
    );
    let names: Vec<&str> = d
        .get(id)
        .unwrap()
        .links
        .iter()
        .map(|l| l.name.as_str())
        .collect();
    assert!(
        names.contains(&"ut-a") && names.contains(&"ut-b"),
        "{names:?}"
    );
    // And its removal.
    ip(&["-n", &ns.0, "link", "del", "ut-a"]);
    assert!(wait_for(&mut d, |f| *f == Found::Relinked(id)).is_some());
    assert_eq!(d.get(id).unwrap().links.len(), 1);
}

#[test]
fn removed_namespace_is_forgotten_and_not_kept_alive() {
    if !privileged("removed_namespace_is_forgotten_and_not_kept_alive") {
        return;
    }
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let ns = TestNetns::add(3);
    let id = ns.id();
    let mut d = Discovery::new(&named(&ns.0)).unwrap();
    d.pass(true).unwrap();
    let cookie = d.get(id).unwrap().cookie;
    // Our subscription holds the namespace: a veth into another one outlives the bind
    // mount as long as the socket is open, and goes with the namespace once it is closed.
    let other = TestNetns::add(4);
    ip(&[
        "-n", &ns.0, "link", "add", "eth0", "type", "veth", "peer", "name", "ut-peer", "netns",
        &other.0,
    ]);
    ip(&["netns", "del", &ns.0]);
    let took = wait_for(&mut d, |f| *f == Found::Vanished { id, cookie });
    assert!(took.is_some(), "{} not forgotten within {WITHIN:?}", ns.0);
    assert!(d.get(id).is_none());
    // The namespace is destroyed asynchronously (cleanup_net), its veth pair with it.
    let other_path = Path::new("/run/netns").join(&other.0);
    let peer_left = || {
        netns::with_netns(&other_path, netns::list_links)
            .unwrap()
            .iter()
            .any(|l| l.name == "ut-peer")
    };
    let start = Instant::now();
    while peer_left() {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "ut-peer still in {}: {} was kept alive",
            other.0,
            ns.0
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn waker_ends_a_blocked_turn() {
    let mut d = Discovery::new(&AttachSpec::default()).unwrap();
    let waker = d.waker();
    let start = Instant::now();
    let t = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(50));
        waker.wake();
    });
    let turn = d.turn(Duration::from_secs(5)).unwrap();
    t.join().unwrap();
    assert!(turn.found.is_empty() && !turn.full);
    assert!(
        start.elapsed() < Duration::from_secs(2),
        "{:?}",
        start.elapsed()
    );
}
