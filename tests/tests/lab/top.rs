//! `dnspath top` in the lab: the batch tables against traffic of known shape (the numbers
//! equal what was sent), the stop summary of `trace`, and the full-screen view in a real
//! terminal (tmux): its header and rows, a loop's banner, and the terminal given back after
//! `q` and SIGTERM.
use std::{
    path::{Path, PathBuf},
    process::Command,
    thread,
    time::{Duration, Instant},
};

use lab::{
    hole::{Hole, HOLE_ADDR, SLOW_ADDR},
    tracer::{dnspath_bin, require_tools, Tracer},
    Lab,
};
use serde_json::Value;

use crate::shared::{dig_ok, lab, lab_with_tools, of_type};

/// A second client pod, `<prefix>-client2` at this address (a pod namespace routed from the
/// node like the lab's own, asking the Service).
const CLIENT2: &str = "10.244.1.9";

/// `dig ARGS` in namespace `ns`; its output.
fn dig_in(lab: &Lab, ns: &str, args: &[&str]) -> String {
    let mut all = vec!["dig"];
    all.extend_from_slice(args);
    let o = lab.exec(ns, &all);
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// The row of `table` whose first column is `first`.
fn row<'a>(snap: &'a Value, table: &str, key: &str, first: &str) -> &'a Value {
    snap[table]["rows"]
        .as_array()
        .and_then(|rows| rows.iter().find(|r| r[key] == first))
        .unwrap_or_else(|| panic!("no {table} row {first}: {snap:#}"))
}

/// 5 questions for `www.lab.test.` and one NXDOMAIN from the client, 3 from a second client
/// pod, all through the Service; one to a dead server and one to a slow one (300 ms):
/// `top --once -o json` counts exactly those in its clients', servers' and names' tables.
#[test]
fn batch_tables_count_what_was_sent() {
    let Some(lab) = lab() else { return };
    require_tools(&["dig"]);
    let _hole = Hole::new(&lab).unwrap();
    let _slow = Hole::slow(&lab, Duration::from_millis(300), 1).unwrap();
    let client2 = Hole::serving(&lab, "client2", CLIENT2, &["sleep", "60"]).unwrap();
    let t = Tracer::start(
        &lab,
        lab.node_ns(),
        &[
            "top",
            "--once",
            "-o",
            "json",
            "--timeout",
            "1",
            "--rows",
            "50",
        ],
    )
    .unwrap();
    for _ in 0..5 {
        dig_ok(&lab, &["+tries=1", "+time=2", "www.lab.test.", "A"]);
    }
    let nx = lab.dig(&["+tries=1", "+time=2", "nope.lab.test.", "A"]);
    assert!(String::from_utf8_lossy(&nx.stdout).contains("NXDOMAIN"));
    let at_hole = format!("@{HOLE_ADDR}");
    let at_slow = format!("@{SLOW_ADDR}");
    let void = lab.dig(&["+tries=1", "+time=1", &at_hole, "void.lab.test.", "A"]);
    assert!(!void.status.success(), "the hole answered: {void:?}");
    dig_ok(
        &lab,
        &["+tries=1", "+time=2", &at_slow, "slow.lab.test.", "A"],
    );
    for _ in 0..3 {
        let out = dig_in(
            &lab,
            client2.ns(),
            &["+tries=1", "+time=2", "@10.96.0.10", "www.lab.test.", "A"],
        );
        assert!(out.contains("status: NOERROR"), "{out}");
    }
    // The dead server's question decided (1 s timeout).
    thread::sleep(Duration::from_millis(1500));
    let out = t.stop();
    assert!(out.status.success(), "{}", out.stderr);
    let lines: Vec<Value> = out
        .stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    assert_eq!(lines.len(), 1, "--once: one snapshot: {}", out.stdout);
    let snap = &lines[0];
    assert_eq!(snap["type"], "top");

    let client = format!("{}/10.244.1.2", lab.client_ns());
    let c = row(snap, "clients", "client", &client);
    assert_eq!(c["questions"], 8, "{c:#}");
    assert_eq!(c["answered_pct"], 87.5, "{c:#}");
    assert_eq!(c["nxdomain"], 1, "{c:#}");
    assert_eq!(c["unanswered"], 1, "{c:#}");
    assert_eq!(c["servfail"], 0, "{c:#}");
    assert_eq!(c["search"], 1.0, "FQDNs: no search list: {c:#}");
    let c2 = row(
        snap,
        "clients",
        "client",
        &format!("{}/{CLIENT2}", client2.ns()),
    );
    assert_eq!(c2["questions"], 3, "{c2:#}");
    assert_eq!(c2["answered_pct"], 100.0, "{c2:#}");

    let servers = snap["servers"]["rows"].as_array().unwrap();
    let service: Vec<&Value> = servers.iter().filter(|s| s["role"] == "service").collect();
    let through_service: u64 = service.iter().map(|s| s["queries"].as_u64().unwrap()).sum();
    assert_eq!(
        through_service, 9,
        "5 + 1 + 3 through the Service: {servers:#?}"
    );
    let nxdomain: u64 = service
        .iter()
        .map(|s| s["nxdomain"].as_u64().unwrap())
        .sum();
    assert_eq!(nxdomain, 1, "{servers:#?}");
    assert!(
        service
            .iter()
            .all(|s| s["upstream_p50_ms"].is_number() && s["own_p50_ms"].is_number()),
        "each CoreDNS pod forwarded: its time split: {servers:#?}"
    );
    let upstream = row(snap, "servers", "server", "10.250.0.53:53");
    assert_eq!(upstream["role"], "upstream", "{upstream:#}");
    let hole = row(snap, "servers", "server", &format!("{HOLE_ADDR}:53"));
    assert_eq!(
        (&hole["queries"], &hole["unanswered"]),
        (&1.into(), &1.into()),
        "{hole:#}"
    );
    let slow = row(snap, "servers", "server", &format!("{SLOW_ADDR}:53"));
    let p50 = slow["p50_ms"].as_f64().unwrap();
    assert!(
        (280.0..400.0).contains(&p50),
        "the slow server's 300 ms: {slow:#}"
    );

    let www = snap["names"]["rows"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["name"] == "www.lab.test." && n["qtype"] == "A")
        .unwrap_or_else(|| panic!("{snap:#}"));
    assert_eq!(
        (&www["questions"], &www["answered"]),
        (&8.into(), &8.into()),
        "{www:#}"
    );
    assert_eq!(
        row(snap, "names", "name", "nope.lab.test.")["last"],
        "NXDOMAIN"
    );
    assert_eq!(row(snap, "names", "name", "void.lab.test.")["failed"], 1);
    assert!(
        snap["status"]["packets"].as_u64().unwrap() >= 40,
        "{:#}",
        snap["status"]
    );
    assert_eq!(snap["status"]["lost"], 0);
}

/// `trace -o json` ends with a `summary` record before `stats`: the questions sent, their
/// rcodes, the client as the busiest.
#[test]
fn trace_stops_with_a_summary_of_what_was_sent() {
    let Some(lab) = lab() else { return };
    let t = Tracer::transactions(&lab, &["--all-netns"]).unwrap();
    for _ in 0..3 {
        dig_ok(&lab, &["+tries=1", "+time=2", "www.lab.test.", "A"]);
    }
    let _ = lab.dig(&["+tries=1", "+time=2", "nope.lab.test.", "A"]);
    thread::sleep(Duration::from_millis(300));
    let recs = t.stop().records();
    let n = recs.len();
    assert_eq!(recs[n - 1]["type"], "stats");
    assert_eq!(recs[n - 2]["type"], "summary", "{:#}", recs[n - 2]);
    let s = &recs[n - 2];
    assert_eq!(s["questions"], of_type(&recs, "transaction").len());
    assert_eq!(s["questions"], 4, "{s:#}");
    assert_eq!(
        s["outcomes"][0],
        serde_json::json!({"what": "answered", "count": 4, "ratio": 1.0})
    );
    assert_eq!(
        s["rcodes"][0],
        serde_json::json!({"what": "NOERROR", "count": 3, "ratio": 0.75})
    );
    assert_eq!(
        s["busiest_clients"][0]["name"],
        format!("{}/10.244.1.2", lab.client_ns())
    );
    assert_eq!(s["busiest_clients"][0]["count"], 4);
    assert!(s["p50_ms"].as_f64().unwrap() > 0.0, "{s:#}");
}

/// tmux on a socket of this test's, removed (server killed) on drop.
struct Tmux {
    socket: PathBuf,
}

impl Tmux {
    fn new(dir: &Path) -> Self {
        Self {
            socket: dir.join("tmux.sock"),
        }
    }

    fn run(&self, args: &[&str]) -> String {
        let o = Command::new("tmux")
            .arg("-S")
            .arg(&self.socket)
            .args(args)
            .output()
            .unwrap_or_else(|e| panic!("tmux {args:?}: {e}"));
        assert!(
            o.status.success(),
            "tmux {args:?}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        String::from_utf8_lossy(&o.stdout).into_owned()
    }

    fn screen(&self, target: &str) -> String {
        self.run(&["capture-pane", "-p", "-t", target])
    }

    fn format(&self, target: &str, f: &str) -> String {
        self.run(&["display-message", "-p", "-t", target, f])
            .trim()
            .to_string()
    }

    /// Waits until the pane's screen holds every one of `needles`; the screen.
    fn wait_for(&self, target: &str, needles: &[&str], timeout: Duration) -> String {
        let until = Instant::now() + timeout;
        loop {
            let s = self.screen(target);
            if needles.iter().all(|n| s.contains(n)) {
                return s;
            }
            assert!(
                Instant::now() < until,
                "{needles:?} not on the screen:\n{s}"
            );
            thread::sleep(Duration::from_millis(200));
        }
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = Command::new("tmux")
            .arg("-S")
            .arg(&self.socket)
            .arg("kill-server")
            .output();
        let _ = std::fs::remove_file(&self.socket);
    }
}

/// `dnspath top` in a tmux window of 100×30 in the node's namespace; the shell after it says
/// its exit status and the terminal's line discipline (`icanon`, `echo`: raw mode undone).
fn start_top(lab: &Lab, tmux: &Tmux, name: &str) {
    let cmd = format!(
        "ip netns exec {} {} top --timeout 1; echo \"EXITED $?\"; stty -a | tr ' ;' '\\n\\n' | grep -x -e icanon -e -icanon -e echo -e -echo | tr '\\n' ' '; echo; sleep 60",
        lab.node_ns(),
        dnspath_bin().display()
    );
    tmux.run(&[
        "new-session",
        "-d",
        "-s",
        name,
        "-x",
        "100",
        "-y",
        "30",
        "-e",
        "TERM=xterm-256color",
        "sh",
        "-c",
        &cmd,
    ]);
}

/// The pid of the `dnspath` the window's shell started (its child).
fn top_pid(tmux: &Tmux, target: &str) -> u32 {
    let shell = tmux.format(target, "#{pane_pid}");
    let children =
        std::fs::read_to_string(format!("/proc/{shell}/task/{shell}/children")).unwrap_or_default();
    children
        .split_whitespace()
        .next()
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("no child of the shell {shell}"))
}

/// The full-screen view in a real terminal: the header, the client's and the CoreDNS pods'
/// rows as queries come, then the terminal as it was after `q` (normal screen, cooked mode,
/// cursor shown, exit 0); and the same after SIGTERM.
#[test]
fn the_screen_shows_the_tables_and_gives_the_terminal_back() {
    let Some(lab) = lab_with_tools(&["tmux", "dig"]) else {
        return;
    };
    let tmux = Tmux::new(lab.temp_dir());
    start_top(&lab, &tmux, "q");
    let screen = tmux.wait_for("q", &["[clients]", "CLIENT"], Duration::from_secs(30));
    assert!(screen.starts_with("dnspath top"), "{screen}");
    assert_eq!(tmux.format("q", "#{alternate_on}"), "1", "{screen}");
    for _ in 0..3 {
        dig_ok(&lab, &["+tries=1", "+time=2", "www.lab.test.", "A"]);
    }
    let client = format!("{}/10.244.1.2", lab.client_ns());
    let screen = tmux.wait_for("q", &[&client], Duration::from_secs(5));
    eprintln!("the screen after 3 questions:\n{screen}");
    let line = screen
        .lines()
        .find(|l| l.starts_with(&client))
        .unwrap_or_default();
    let words: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(words.get(2), Some(&"3"), "3 questions: {screen}");
    tmux.run(&["send-keys", "-t", "q", "2"]);
    let screen = tmux.wait_for(
        "q",
        &["[servers]", "SERVER", "10.250.0.53:53"],
        Duration::from_secs(5),
    );
    assert!(
        screen.contains("10.244.1.3:53") || screen.contains("10.244.1.4:53"),
        "a CoreDNS pod's row: {screen}"
    );
    tmux.run(&["send-keys", "-t", "q", "q"]);
    let screen = tmux.wait_for("q", &["EXITED 0"], Duration::from_secs(10));
    assert!(
        screen.contains("icanon") && !screen.contains("-icanon"),
        "{screen}"
    );
    assert!(
        screen.contains("echo") && !screen.contains("-echo"),
        "{screen}"
    );
    assert!(
        !screen.contains("CLIENT"),
        "the alternate screen is left: {screen}"
    );
    assert_eq!(tmux.format("q", "#{alternate_on}"), "0");
    assert_eq!(
        tmux.format("q", "#{cursor_flag}"),
        "1",
        "the cursor is shown"
    );

    start_top(&lab, &tmux, "term");
    tmux.wait_for("term", &["[clients]"], Duration::from_secs(30));
    let pid = top_pid(&tmux, "term");
    // SAFETY: kill(2) of the dnspath this test started.
    unsafe { libc::kill(pid as i32, libc::SIGTERM) };
    let screen = tmux.wait_for("term", &["EXITED 0"], Duration::from_secs(10));
    assert!(
        screen.contains("icanon") && !screen.contains("-icanon"),
        "{screen}"
    );
    assert_eq!(tmux.format("term", "#{alternate_on}"), "0", "{screen}");
    assert_eq!(tmux.format("term", "#{cursor_flag}"), "1");
}

/// A forwarding loop started while `top` is on the screen (a dnsdist pod forwarding to the
/// cluster DNS Service, asked a name it cannot answer) is a banner above the tables; `q`
/// still quits cleanly under it.
#[test]
fn a_loop_started_while_watching_is_a_banner() {
    if !lab::tracer::root_or_skip("network namespaces, eBPF") {
        return;
    }
    require_tools(&["tmux", "dig"]);
    let cfg = lab::LabConfig {
        dns_pods: vec![crate::shared::dnsdist_to_cluster_ip()],
        ..lab::LabConfig::default()
    };
    let Some(lab) = crate::shared::lab_of(cfg) else {
        return;
    };
    let tmux = Tmux::new(lab.temp_dir());
    start_top(&lab, &tmux, "loop");
    let screen = tmux.wait_for("loop", &["[clients]", "CLIENT"], Duration::from_secs(30));
    assert!(!screen.contains("LOOP"), "no loop yet: {screen}");
    let _ = lab.dig(&["+time=1", "+tries=1", "self.lab.test.", "A"]);
    let screen = tmux.wait_for("loop", &["LOOP", "self.lab.test."], Duration::from_secs(15));
    eprintln!("the screen with the loop:\n{screen}");
    let banner = screen
        .lines()
        .find(|l| l.contains("LOOP"))
        .unwrap_or_default();
    assert!(banner.contains("self.lab.test."), "{screen}");
    tmux.run(&["send-keys", "-t", "loop", "q"]);
    let screen = tmux.wait_for("loop", &["EXITED 0"], Duration::from_secs(10));
    assert_eq!(tmux.format("loop", "#{alternate_on}"), "0", "{screen}");
}
