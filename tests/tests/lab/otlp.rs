#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "integration tests fail at the line that broke"
)]
//! `--otlp` against a real OTLP receiver: Arize Phoenix (installed by `cargo xtask setup`
//! into /var/cache/dnspath-lab/phoenix), started in the lab's node namespace on 127.0.0.1
//! with a working directory of its own, queried by trace id. Root only; `--test-threads=1`.
use std::{
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use lab::tracer::NodeTracer;
use lab::{
    hole::{Hole, HOLE_ADDR},
    tracer::{lab_or_skip, Tracer},
    Lab, LabConfig,
};
use serde_json::Value;

const PHOENIX: &str = "/var/cache/dnspath-lab/phoenix/bin/phoenix";

/// Phoenix in the lab's node namespace; stopped by its PID when dropped.
struct Phoenix {
    child: Child,
    /// `ip netns exec NS`, or nothing (this namespace).
    prefix: Vec<String>,
    http: u16,
    grpc: u16,
    dir: std::path::PathBuf,
}

impl Phoenix {
    fn start(lab: &Lab) -> Phoenix {
        Self::start_in(Some(lab.node_ns()))
    }

    /// Phoenix in namespace `ns` (or this one), on 127.0.0.1.
    fn start_in(ns: Option<&str>) -> Phoenix {
        assert!(
            std::path::Path::new(PHOENIX).exists(),
            "{PHOENIX} missing: run `cargo xtask setup` (installs Arize Phoenix for these tests)"
        );
        // Ports of this process's own (another test's Phoenix may run in this namespace).
        let base = 20_000 + (std::process::id() % 20_000) as u16;
        let (http, grpc) = (base, base + 1);
        let dir = std::env::temp_dir().join(format!("dnspath-phoenix-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let log = std::fs::File::create(dir.join("phoenix.log")).unwrap();
        let prefix: Vec<String> = ns.map_or(Vec::new(), |ns| {
            ["ip", "netns", "exec", ns].map(str::to_string).to_vec()
        });
        let mut cmd = Self::command(&prefix, &[PHOENIX, "serve"]);
        cmd.env("PHOENIX_WORKING_DIR", &dir)
            .env("PHOENIX_HOST", "127.0.0.1")
            .env("PHOENIX_PORT", http.to_string())
            .env("PHOENIX_GRPC_PORT", grpc.to_string())
            .env("PHOENIX_TELEMETRY_ENABLED", "false")
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log);
        let child = cmd.spawn().unwrap();
        let p = Phoenix {
            child,
            prefix,
            http,
            grpc,
            dir,
        };
        let t0 = Instant::now();
        while p.get("/v1/projects").is_none() {
            assert!(
                t0.elapsed() < Duration::from_secs(180),
                "Phoenix did not start: {}",
                std::fs::read_to_string(p.dir.join("phoenix.log")).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(500));
        }
        eprintln!("Phoenix ready in {:?}", t0.elapsed());
        p
    }

    fn command(prefix: &[String], args: &[&str]) -> Command {
        let mut all: Vec<&str> = prefix.iter().map(String::as_str).collect();
        all.extend_from_slice(args);
        let mut c = Command::new(all[0]);
        c.args(&all[1..]);
        c
    }

    fn get(&self, path: &str) -> Option<Value> {
        let url = format!("http://127.0.0.1:{}{path}", self.http);
        let o = Self::command(&self.prefix, &["curl", "-sf", "--max-time", "10", &url])
            .stdin(Stdio::null())
            .output()
            .ok()?;
        if !o.status.success() {
            return None;
        }
        serde_json::from_slice(&o.stdout).ok()
    }

    /// The spans of trace `id`, waiting up to 60 s (a loaded machine) for `want` of them to be stored.
    fn spans(&self, id: &str, want: usize) -> Vec<Value> {
        self.spans_up_to(id, want, 100)
    }

    /// [`Phoenix::spans`], at most `limit` of them.
    fn spans_up_to(&self, id: &str, want: usize, limit: usize) -> Vec<Value> {
        let t0 = Instant::now();
        loop {
            let got = self
                .get(&format!(
                    "/v1/projects/default/spans/otlpv1?trace_id={id}&limit={limit}"
                ))
                .and_then(|v| v["data"].as_array().cloned())
                .unwrap_or_default();
            if got.len() >= want || t0.elapsed() > Duration::from_secs(60) {
                return got;
            }
            std::thread::sleep(Duration::from_millis(500));
        }
    }
}

impl Drop for Phoenix {
    fn drop(&mut self) {
        let pid = self.child.id().to_string();
        let _ = Command::new("kill").args(["-TERM", &pid]).status();
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_secs(10) {
            if let Ok(Some(_)) = self.child.try_wait() {
                let _ = std::fs::remove_dir_all(&self.dir);
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// An attribute's value (Phoenix: a list of `{key, value}`, the value an object with one
/// non-null field; or an object of them), as a string.
fn attr(span: &Value, key: &str) -> Option<String> {
    let attrs = &span["attributes"];
    let v = match attrs {
        Value::Array(a) => a
            .iter()
            .find(|kv| kv["key"] == key)
            .map(|kv| kv["value"].clone())?,
        Value::Object(m) => m.get(key).cloned()?,
        _ => return None,
    };
    Some(match v {
        // Phoenix: `{"string_value": "…", "int_value": null, …}`.
        Value::Object(m) => m
            .values()
            .find(|x| !x.is_null())
            .map(|x| x.as_str().map_or(x.to_string(), str::to_string))
            .unwrap_or_default(),
        Value::String(s) => s,
        x => x.to_string(),
    })
}

fn named<'a>(spans: &'a [Value], name: &str) -> Vec<&'a Value> {
    spans.iter().filter(|s| s["name"] == name).collect()
}

fn is_error(span: &Value) -> bool {
    let s = span["status"].to_string().to_ascii_lowercase();
    s.contains("error") || s.contains("\"code\":2")
}

fn events(span: &Value, name: &str) -> usize {
    span["events"]
        .as_array()
        .map_or(0, |e| e.iter().filter(|e| e["name"] == name).count())
}

fn tx_named<'a>(recs: &'a [Value], name: &str) -> &'a Value {
    recs.iter()
        .find(|r| r["type"] == "transaction" && r["question"]["name"] == name)
        .unwrap_or_else(|| panic!("no transaction for {name}"))
}

#[test]
fn transactions_are_traces_in_a_real_receiver() {
    let Some(lab) = lab_or_skip(LabConfig::default()) else {
        return;
    };
    let phoenix = Phoenix::start(&lab);
    let hole = Hole::new(&lab).unwrap();
    let url = format!("http://127.0.0.1:{}", phoenix.http);
    // Every namespace of this lab (not `--all-netns`: other labs may share the machine).
    let traced = |lab: &Lab, extra: &[&str]| {
        let mut args: Vec<&str> = extra.to_vec();
        for ns in lab.namespaces().into_iter().skip(1) {
            args.extend(["--netns", ns]);
        }
        args.extend(["--netns", hole.ns()]);
        Tracer::transactions(lab, &args)
    };

    // 1. OTLP/HTTP: an answered query, an unanswered one, one the kernel drops.
    let t = traced(
        &lab,
        &[
            "--otlp",
            &url,
            "--node-name",
            "lab-node-a",
            "--timeout",
            "1",
        ],
    )
    .unwrap();
    assert!(lab
        .dig(&["+time=2", "+tries=1", "www.lab.test.", "A"])
        .status
        .success());
    lab.dig(&[
        "+time=1",
        "+tries=1",
        &format!("@{HOLE_ADDR}"),
        "void.lab.test.",
        "A",
    ]);
    assert!(lab.pod_dns_drop("-I").status.success());
    lab.dig(&["+time=1", "+tries=1", "dropped.lab.test.", "A"]);
    assert!(lab.pod_dns_drop("-D").status.success());
    std::thread::sleep(Duration::from_millis(2500));
    let out = t.stop();
    let recs = out.records();
    let stats = recs.iter().rev().find(|r| r["type"] == "stats").unwrap();
    eprintln!("stats.otlp: {}", stats["otlp"]);
    assert!(
        stats["otlp"]["transactions_exported"].as_u64().unwrap() >= 3,
        "{stats}"
    );
    assert_eq!(stats["otlp"]["dropped_export_failed"], 0, "{stats}");
    assert_eq!(stats["node"], "lab-node-a");

    // Answered: root → client leg → CoreDNS's server span → its forward → upstream's.
    let ok = tx_named(&recs, "www.lab.test.");
    assert_eq!(ok["node"], "lab-node-a");
    let id = ok["trace_id"].as_str().unwrap();
    assert_eq!(id.len(), 32);
    let spans = phoenix.spans(id, 5);
    eprintln!("answered: {} spans, first {:#}", spans.len(), spans[0]);
    assert!(spans.len() >= 5, "{spans:#?}");
    let root = named(&spans, "DNS A");
    assert_eq!(root.len(), 1, "one root: {spans:#?}");
    let root = root[0];
    assert!(
        root["parent_span_id"]
            .as_str()
            .unwrap_or_default()
            .is_empty(),
        "{root:#}"
    );
    assert_eq!(
        attr(root, "dns.question.name").as_deref(),
        Some("www.lab.test.")
    );
    let query = named(&spans, "query A");
    assert_eq!(query.len(), 1, "{spans:#?}");
    let query = query[0];
    assert_eq!(query["parent_span_id"], root["span_id"]);
    assert!(events(query, "hop") >= 4, "{query:#}");
    let serves = named(&spans, "serve A");
    let coredns = serves
        .iter()
        .find(|s| s["parent_span_id"] == query["span_id"])
        .unwrap_or_else(|| panic!("no server span under the client's: {spans:#?}"));
    let forward = named(&spans, "forward A");
    assert_eq!(forward.len(), 1, "{spans:#?}");
    assert_eq!(forward[0]["parent_span_id"], coredns["span_id"]);
    assert!(serves
        .iter()
        .any(|s| s["parent_span_id"] == forward[0]["span_id"]));
    assert!(!is_error(root), "{root:#}");

    // Unanswered: its trace says so.
    let void = tx_named(&recs, "void.lab.test.");
    let spans = phoenix.spans(void["trace_id"].as_str().unwrap(), 2);
    let root = named(&spans, "DNS A")[0];
    assert!(is_error(root), "{root:#}");
    assert!(named(&spans, "query A").iter().all(|q| is_error(q)));

    // Dropped: the drop is an event of the client leg's span, which is an error.
    let dropped = tx_named(&recs, "dropped.lab.test.");
    assert_eq!(dropped["outcome"], "dropped", "{dropped:#}");
    let spans = phoenix.spans(dropped["trace_id"].as_str().unwrap(), 2);
    let q = named(&spans, "query A");
    assert!(!q.is_empty(), "{spans:#?}");
    assert!(events(q[0], "kernel drop") == 1, "{:#}", q[0]);
    assert!(is_error(q[0]));
    assert!(is_error(named(&spans, "DNS A")[0]));
    // One trace per query: the three are distinct.
    let ids: std::collections::BTreeSet<&str> = [ok, void, dropped]
        .iter()
        .map(|t| t["trace_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids.len(), 3);

    // 2. OTLP/gRPC with --otlp-redact-names: no name in what the receiver stored.
    let grpc = format!("http://127.0.0.1:{}", phoenix.grpc);
    let t = traced(
        &lab,
        &[
            "--otlp",
            &grpc,
            "--otlp-protocol",
            "grpc",
            "--otlp-redact-names",
        ],
    )
    .unwrap();
    assert!(lab
        .dig(&["+time=2", "+tries=1", "www.lab.test.", "A"])
        .status
        .success());
    std::thread::sleep(Duration::from_millis(1500));
    let recs = t.stop().records();
    let red = tx_named(&recs, "www.lab.test.");
    let spans = phoenix.spans(red["trace_id"].as_str().unwrap(), 5);
    assert!(spans.len() >= 5, "gRPC export: {spans:#?}");
    let stored = serde_json::to_string(&spans).unwrap();
    assert!(
        !stored.contains("lab.test"),
        "a name left the node: {stored}"
    );
    assert!(
        !stored.contains("10.250.0.80"),
        "an answer left the node: {stored}"
    );

    // 3. A receiver that is down: tracing loses nothing; the loss is counted.
    let closed = format!("http://127.0.0.1:{}", phoenix.grpc + 1);
    let t = traced(&lab, &["--otlp", &closed, "--otlp-flush-timeout", "2"]).unwrap();
    for i in 0..5 {
        let o = lab.dig(&["+time=2", "+tries=1", &format!("down{i}.lab.test."), "A"]);
        assert!(o.status.success());
    }
    std::thread::sleep(Duration::from_millis(1500));
    let t0 = Instant::now();
    let out = t.stop();
    eprintln!("stopped in {:?} with the receiver down", t0.elapsed());
    assert!(t0.elapsed() < Duration::from_secs(10));
    let recs = out.records();
    let txs: Vec<&Value> = recs.iter().filter(|r| r["type"] == "transaction").collect();
    for i in 0..5 {
        let name = format!("down{i}.lab.test.");
        assert!(
            txs.iter().any(|t| t["question"]["name"] == name.as_str()),
            "{name}"
        );
    }
    let o = &recs.iter().rev().find(|r| r["type"] == "stats").unwrap()["otlp"];
    eprintln!("receiver down: {o}");
    assert_eq!(o["transactions_exported"], 0, "{o}");
    let lost = o["dropped_export_failed"].as_u64().unwrap()
        + o["dropped_at_exit"].as_u64().unwrap()
        + o["dropped_queue_full"].as_u64().unwrap();
    assert_eq!(
        lost,
        txs.len() as u64,
        "every transaction counted as lost: {o}"
    );
    assert!(o["request_failures"].as_u64().unwrap() >= 1, "{o}");

    // 4. The agent: the same sink; its metrics count what the receiver accepted, and
    // SIGTERM flushes within the bound.
    let listen = format!("127.0.0.1:{}", phoenix.grpc + 2);
    let agent = Tracer::start(
        &lab,
        lab.node_ns(),
        &[
            "agent",
            "--listen",
            &listen,
            "--otlp",
            &url,
            "--node-name",
            "lab-node-a",
        ],
    )
    .unwrap();
    let metrics = || {
        let o = lab.exec(
            lab.node_ns(),
            &[
                "curl",
                "-sf",
                "--max-time",
                "5",
                &format!("http://{listen}/metrics"),
            ],
        );
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    let value = |text: &str, name: &str| -> f64 {
        text.lines()
            .find_map(|l| l.strip_prefix(name).and_then(|v| v.trim().parse().ok()))
            .unwrap_or(0.0)
    };
    let t0 = Instant::now();
    while !metrics().contains("dnspath_packets_total") {
        assert!(
            t0.elapsed() < Duration::from_secs(15),
            "agent never served metrics"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    for i in 0..3 {
        let o = lab.dig(&["+time=2", "+tries=1", &format!("agent{i}.lab.test."), "A"]);
        assert!(o.status.success());
    }
    let t0 = Instant::now();
    loop {
        let m = metrics();
        if value(&m, "dnspath_otlp_transactions_exported_total ") >= 3.0 {
            assert!(
                value(&m, "dnspath_otlp_spans_exported_total ") >= 3.0 * 5.0,
                "{m}"
            );
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "nothing exported:\n{m}"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    // SAFETY: kill(2) on our own child's PID, not yet reaped.
    unsafe {
        libc::kill(agent.pid() as libc::pid_t, libc::SIGTERM);
    }
    let t0 = Instant::now();
    let out = agent.wait();
    assert!(out.status.success(), "{}", out.stderr);
    assert!(t0.elapsed() < Duration::from_secs(10), "{:?}", t0.elapsed());
}

/// Every event name of the spans of a trace.
fn all_events(spans: &[Value]) -> Vec<String> {
    spans
        .iter()
        .flat_map(|s| s["events"].as_array().cloned().unwrap_or_default())
        .filter_map(|e| e["name"].as_str().map(str::to_string))
        .collect()
}

/// The lab's conntrack race (forced: docs/lab.md) and a forwarding loop born at runtime (both
/// "CoreDNS" pods forward to their own Service) as span events in a real receiver; healthy
/// queries before and after carry hop events only and no error.
#[test]
fn races_and_loops_are_span_events_and_healthy_queries_have_none() {
    let Some(mut lab) = lab_or_skip(LabConfig::default()) else {
        return;
    };
    let phoenix = Phoenix::start(&lab);
    let url = format!("http://127.0.0.1:{}", phoenix.http);
    let mut args: Vec<&str> = vec!["--otlp", &url, "--timeout", "1"];
    let namespaces: Vec<String> = lab
        .namespaces()
        .into_iter()
        .skip(1)
        .map(str::to_string)
        .collect();
    for ns in &namespaces {
        args.extend(["--netns", ns]);
    }
    let t = Tracer::transactions(&lab, &args).unwrap();
    assert!(lab
        .dig(&["+time=2", "+tries=1", "healthy0.lab.test.", "A"])
        .status
        .success());
    let rig = lab::race::RaceRig::install(&lab, 300).unwrap();
    let mut shots = Vec::new();
    for i in 0..2 {
        let name = format!("otlprace{i}.lab.test.");
        shots.push((name.clone(), lab::race::force_race(&lab, &name).unwrap()));
    }
    rig.remove().unwrap();
    // The loop: both pods forward to the Service, which sends it to either pod.
    lab.reconfigure_dns_pod(0, crate::shared::dnsdist_to_cluster_ip())
        .unwrap();
    lab.reconfigure_dns_pod(1, crate::shared::dnsdist_to_cluster_ip())
        .unwrap();
    let _ = lab.dig(&["+time=1", "+tries=1", "otlploop.lab.test.", "A"]);
    std::thread::sleep(Duration::from_secs(3));
    for i in 0..2 {
        lab.reconfigure_dns_pod(i, lab::DnsPodConfig::new(lab::DnsServerKind::Dnsdist))
            .unwrap();
    }
    let t0 = Instant::now();
    while !lab
        .dig(&["+time=2", "+tries=1", "healthy1.lab.test.", "A"])
        .status
        .success()
    {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "the lab never healed"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    std::thread::sleep(Duration::from_secs(4));
    let out = t.stop();
    assert!(out.status.success(), "{}", out.stderr);
    let recs = out.records();
    let races: Vec<&Value> = recs
        .iter()
        .filter(|r| r["type"] == "race" && r["verdict"] == "race-drop")
        .collect();
    assert_eq!(races.len(), 2, "the lab forced two races: {races:#?}");
    assert!(
        recs.iter()
            .any(|r| r["type"] == "loop" && r["question"]["name"] == "otlploop.lab.test."),
        "the lab made a loop"
    );

    // The races: the lost A query's leg and the root name the race; both are errors.
    for (name, shot) in &shots {
        let tx = recs
            .iter()
            .find(|r| {
                r["type"] == "transaction"
                    && r["question"]["name"] == name.as_str()
                    && r["question"]["type"] == "A"
            })
            .unwrap_or_else(|| panic!("no A transaction for {name}"));
        let spans = phoenix.spans(tx["trace_id"].as_str().unwrap(), 2);
        let root = named(&spans, "DNS A");
        assert_eq!(root.len(), 1, "{spans:#?}");
        assert_eq!(events(root[0], "conntrack race"), 1, "{:#}", root[0]);
        let e = root[0]["events"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["name"] == "conntrack race")
            .unwrap();
        assert_eq!(
            attr(e, "dnspath.dns_id").as_deref(),
            Some(shot.a_id.to_string().as_str()),
            "{e:#}"
        );
        assert!(is_error(root[0]), "{:#}", root[0]);
        let lost = named(&spans, "query A")
            .into_iter()
            .find(|q| events(q, "conntrack race") == 1)
            .unwrap_or_else(|| panic!("no client span with the race: {spans:#?}"));
        assert!(is_error(lost), "{lost:#}");
        assert_eq!(events(lost, "kernel drop"), 0, "named for what it was");
    }

    // The loop: the question's trace has the cycle as events, and is an error.
    let looped: Vec<&Value> = recs
        .iter()
        .filter(|r| r["type"] == "transaction" && r["question"]["name"] == "otlploop.lab.test.")
        .collect();
    assert!(!looped.is_empty());
    let mut with_loop = 0;
    for tx in &looped {
        let spans = phoenix.spans_up_to(tx["trace_id"].as_str().unwrap(), 2, 1000);
        let names = all_events(&spans);
        if names.iter().any(|n| n == "forwarding loop") {
            with_loop += 1;
            let root = named(&spans, "DNS A");
            assert!(root.iter().all(|r| is_error(r)), "{root:#?}");
            let closing = spans
                .iter()
                .find(|s| s["name"] == "forward A" && events(s, "forwarding loop") == 1)
                .unwrap_or_else(|| panic!("no closing leg with the loop: {spans:#?}"));
            assert!(is_error(closing), "{closing:#}");
            let e = closing["events"]
                .as_array()
                .unwrap()
                .iter()
                .find(|e| e["name"] == "forwarding loop")
                .unwrap();
            let servers = attr(e, "dnspath.loop.servers").unwrap_or_default();
            assert!(servers.contains(":53"), "{e:#}");
        }
    }
    eprintln!(
        "loop: {} transactions of the looping question, {with_loop} with the loop event",
        looped.len()
    );
    assert!(with_loop >= 1, "{looped:#?}");

    // Healthy queries, before and after: hops only, no error.
    for name in ["healthy0.lab.test.", "healthy1.lab.test."] {
        let tx = tx_named(&recs, name);
        let spans = phoenix.spans(tx["trace_id"].as_str().unwrap(), 5);
        assert!(spans.len() >= 5, "{name}: {spans:#?}");
        let names = all_events(&spans);
        assert!(names.iter().all(|n| n == "hop"), "{name}: {names:?}");
        assert!(spans.iter().all(|s| !is_error(s)), "{name}: {spans:#?}");
    }
}

fn hop_nodes(span: &Value) -> std::collections::BTreeSet<String> {
    span["events"]
        .as_array()
        .map(|e| e.iter().filter_map(|e| attr(e, "k8s.node.name")).collect())
        .unwrap_or_default()
}

/// Two nodes joined by VXLAN (flannel's shape), one dnspath per node seeing only that
/// node's namespaces: the client's query to the DNS pod on the other node is one trace, the
/// client node's root and client span, the serving node's server span under that client
/// span, each with its own node's hops — joined by the ids alone.
#[test]
fn a_query_across_nodes_is_one_trace_with_both_nodes_spans() {
    if !lab::tracer::root_or_skip("two nodes joined by VXLAN") {
        return;
    }
    let nodes = lab::tunnel::VxlanNodes::start().unwrap();
    let phoenix = Phoenix::start_in(None);
    let url = format!("http://127.0.0.1:{}", phoenix.http);
    let otlp = |node| ["--otlp", url.as_str(), "--node-name", node];
    let a = NodeTracer::start(
        &nodes.dir,
        "node-a",
        &[&nodes.node_a, &nodes.client],
        &otlp("node-a"),
    )
    .unwrap();
    let b = NodeTracer::start(
        &nodes.dir,
        "node-b",
        &[&nodes.node_b, &nodes.dns],
        &otlp("node-b"),
    )
    .unwrap();
    for i in 0..3 {
        assert_eq!(
            nodes.dig(&format!("q{i}.tunnel.test.")),
            lab::tunnel::ANSWER.to_string()
        );
    }
    std::thread::sleep(Duration::from_millis(1500));
    let (ra, rb) = (a.stop().unwrap(), b.stop().unwrap());
    for i in 0..3 {
        let name = format!("q{i}.tunnel.test.");
        let find = |recs: &[Value]| -> Value {
            recs.iter()
                .find(|r| r["type"] == "transaction" && r["question"]["name"] == name.as_str())
                .cloned()
                .unwrap_or_else(|| panic!("no transaction for {name}: {recs:#?}"))
        };
        let (ta, tb) = (find(&ra), find(&rb));
        assert_eq!(ta["node"], "node-a");
        assert_eq!(tb["node"], "node-b");
        assert_eq!(
            ta["trace_id"], tb["trace_id"],
            "the two nodes agree: {ta:#}\n{tb:#}"
        );
        let spans = phoenix.spans(ta["trace_id"].as_str().unwrap(), 3);
        eprintln!("{name}: {} spans", spans.len());
        let root = named(&spans, "DNS A");
        assert_eq!(root.len(), 1, "one root, node A's: {spans:#?}");
        let query = named(&spans, "query A");
        assert_eq!(query.len(), 1, "{spans:#?}");
        assert_eq!(query[0]["parent_span_id"], root[0]["span_id"]);
        assert_eq!(hop_nodes(query[0]), ["node-a".to_string()].into());
        let serve = named(&spans, "serve A");
        assert_eq!(serve.len(), 1, "node B's server span: {spans:#?}");
        assert_eq!(
            serve[0]["parent_span_id"], query[0]["span_id"],
            "node B's server span under node A's client span"
        );
        assert_eq!(hop_nodes(serve[0]), ["node-b".to_string()].into());
        assert!(!is_error(root[0]) && !is_error(serve[0]));
    }
}

/// A CA, a server certificate for 127.0.0.1 and a client certificate, made with openssl in
/// `dir`; stunnel (a real TLS terminator) in front of Phoenix's two ports.
struct TlsFront {
    /// stunnel, ended by its PID when dropped.
    child: Child,
    dir: std::path::PathBuf,
    /// HTTPS, client certificate required (mutual TLS).
    https: u16,
    /// gRPC over TLS, server certificate only.
    grpcs: u16,
}

impl TlsFront {
    fn start(lab: &Lab, phoenix: &Phoenix) -> TlsFront {
        lab::tracer::require_tools(&["openssl", "stunnel4"]);
        let dir = std::env::temp_dir().join(format!("dnspath-tls-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let openssl = |args: &[&str]| {
            let o = Command::new("openssl")
                .args(args)
                .current_dir(&dir)
                .output()
                .unwrap();
            assert!(o.status.success(), "openssl {args:?}: {o:?}");
        };
        let ec = [
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
        ];
        let mut ca = vec!["req", "-x509", "-keyout", "ca.key", "-out", "ca.pem"];
        ca.extend(ec);
        ca.extend(["-days", "2", "-subj", "/CN=dnspath lab CA"]);
        openssl(&ca);
        for (name, ext) in [
            ("server", "subjectAltName=IP:127.0.0.1"),
            ("client", "extendedKeyUsage=clientAuth"),
        ] {
            let (key, csr, pem) = (
                format!("{name}.key"),
                format!("{name}.csr"),
                format!("{name}.pem"),
            );
            let mut req = vec!["req", "-keyout", &key, "-out", &csr];
            req.extend(ec);
            let subj = format!("/CN=dnspath lab {name}");
            req.extend(["-subj", &subj]);
            openssl(&req);
            std::fs::write(dir.join(format!("{name}.ext")), ext).unwrap();
            let extfile = format!("{name}.ext");
            openssl(&[
                "x509",
                "-req",
                "-in",
                &csr,
                "-CA",
                "ca.pem",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-days",
                "2",
                "-extfile",
                &extfile,
                "-out",
                &pem,
            ]);
        }
        let (https, grpcs) = (phoenix.grpc + 10, phoenix.grpc + 11);
        let d = dir.display();
        let conf = format!(
            "foreground = yes\npid =\noutput = {d}/stunnel.log\ndebug = 5\n\
             cert = {d}/server.pem\nkey = {d}/server.key\n\
             [https]\naccept = 127.0.0.1:{https}\nconnect = 127.0.0.1:{}\n\
             CAfile = {d}/ca.pem\nverifyChain = yes\nrequireCert = yes\n\
             [grpcs]\naccept = 127.0.0.1:{grpcs}\nconnect = 127.0.0.1:{}\n",
            phoenix.http, phoenix.grpc
        );
        std::fs::write(dir.join("stunnel.conf"), conf).unwrap();
        let conf = dir.join("stunnel.conf");
        let child = lab
            .spawn_in(lab.node_ns(), &["stunnel4", conf.to_str().unwrap()])
            .unwrap();
        // Listening: a TCP connect in the node namespace succeeds.
        let t0 = Instant::now();
        let probe = format!("exec 3<>/dev/tcp/127.0.0.1/{grpcs}");
        while !lab
            .exec(lab.node_ns(), &["bash", "-c", &probe])
            .status
            .success()
        {
            assert!(
                t0.elapsed() < Duration::from_secs(10),
                "stunnel did not start: {}",
                std::fs::read_to_string(dir.join("stunnel.log")).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        TlsFront {
            child,
            dir,
            https,
            grpcs,
        }
    }

    fn path(&self, file: &str) -> String {
        self.dir.join(file).to_string_lossy().into_owned()
    }
}

impl Drop for TlsFront {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// `https://` endpoints: OTLP/HTTP with mutual TLS and OTLP/gRPC over TLS through a real TLS
/// terminator reach the receiver, trusting the CA of `OTEL_EXPORTER_OTLP_CERTIFICATE`; without
/// the client certificate the server refuses, and that is a counted loss, not a lost trace.
#[test]
fn https_endpoints_with_the_standard_certificate_variables() {
    let Some(lab) = lab_or_skip(LabConfig::default()) else {
        return;
    };
    let phoenix = Phoenix::start(&lab);
    let tls = TlsFront::start(&lab, &phoenix);
    let ca = format!("OTEL_EXPORTER_OTLP_CERTIFICATE={}", tls.path("ca.pem"));
    let cert = format!(
        "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE={}",
        tls.path("client.pem")
    );
    let key = format!("OTEL_EXPORTER_OTLP_CLIENT_KEY={}", tls.path("client.key"));
    let run = |env: &[&str], otlp: &[&str], name: &str| -> Vec<Value> {
        let mut wrapper = vec!["env"];
        wrapper.extend_from_slice(env);
        let mut args = vec!["trace", "-o", "json", "--view", "transactions"];
        for ns in lab.namespaces().into_iter().skip(1) {
            args.extend(["--netns", ns]);
        }
        args.extend(["--otlp-flush-timeout", "3"]);
        args.extend_from_slice(otlp);
        let t = Tracer::start_under(
            &lab,
            lab.node_ns(),
            &wrapper,
            &args,
            true,
            Duration::from_secs(30),
        )
        .unwrap();
        assert!(lab
            .dig(&["+time=2", "+tries=1", name, "A"])
            .status
            .success());
        std::thread::sleep(Duration::from_millis(1500));
        t.stop().records()
    };
    let otlp_stats =
        |recs: &[Value]| recs.iter().rev().find(|r| r["type"] == "stats").unwrap()["otlp"].clone();

    // 1. OTLP/HTTP over mutual TLS.
    let url = format!("https://127.0.0.1:{}", tls.https);
    let recs = run(&[&ca, &cert, &key], &["--otlp", &url], "www.lab.test.");
    let o = otlp_stats(&recs);
    eprintln!("https + client certificate: {o}");
    assert!(o["transactions_exported"].as_u64().unwrap() >= 1, "{o}");
    assert_eq!(o["request_failures"], 0, "{o}");
    let tx = tx_named(&recs, "www.lab.test.");
    let spans = phoenix.spans(tx["trace_id"].as_str().unwrap(), 5);
    assert!(spans.len() >= 5, "spans over HTTPS: {spans:#?}");

    // 2. OTLP/gRPC over TLS (HTTP/2), server certificate only.
    let url = format!("https://127.0.0.1:{}", tls.grpcs);
    let recs = run(
        &[&ca],
        &["--otlp", &url, "--otlp-protocol", "grpc"],
        "www.lab.test.",
    );
    let o = otlp_stats(&recs);
    eprintln!("grpc over TLS: {o}");
    assert!(o["transactions_exported"].as_u64().unwrap() >= 1, "{o}");
    let tx = tx_named(&recs, "www.lab.test.");
    let spans = phoenix.spans(tx["trace_id"].as_str().unwrap(), 2);
    assert!(spans.len() >= 2, "spans over gRPC+TLS: {spans:#?}");

    // 3. The mutual-TLS port without a client certificate: refused by the server; the
    // transaction is still traced, its spans counted as lost, none exported.
    let url = format!("https://127.0.0.1:{}", tls.https);
    let recs = run(&[&ca], &["--otlp", &url], "www.lab.test.");
    let o = otlp_stats(&recs);
    eprintln!("https without a client certificate: {o}");
    let tx = tx_named(&recs, "www.lab.test.");
    assert_eq!(tx["outcome"], "answered");
    assert_eq!(o["transactions_exported"], 0, "{o}");
    assert!(o["request_failures"].as_u64().unwrap() >= 1, "{o}");
    let lost =
        o["dropped_export_failed"].as_u64().unwrap() + o["dropped_at_exit"].as_u64().unwrap();
    assert!(lost >= 1, "{o}");
}
