#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "integration tests fail at the line that broke"
)]
//! deploy/grafana's dashboards: the committed JSON is what `dashboards.py` (the Grafana
//! Foundation SDK) writes; docs/metrics.md names, for every metric, a panel that shows it
//! and each panel links to its metrics' rows; and every query of every panel, run by a real
//! Prometheus (Debian's `prometheus`, `cargo xtask setup`) scraping two agents in the lab at
//! 1 s while the lab makes known traffic — N answered questions, search-list NXDOMAIN walks,
//! forced conntrack races, a dead upstream, a forwarding loop — returns series, with the
//! values that traffic should give. Root only for the last; `--test-threads=1`.
use std::{
    collections::{BTreeMap, BTreeSet},
    path::PathBuf,
    process::{Child, Command, Stdio},
    thread,
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use crate::shared::{deploy_dir, lab};
use lab::{
    hole::{Hole, HOLE_ADDR},
    kubelet::{KubeletPods, Node},
    race,
    tracer::Tracer,
    DnsPodConfig, DnsServerKind, Lab, Pod,
};
use serde_json::Value;

fn grafana_dir() -> PathBuf {
    deploy_dir().join("grafana")
}

/// The dashboards' files, by name.
fn dashboards() -> BTreeMap<String, Value> {
    let mut out = BTreeMap::new();
    for e in std::fs::read_dir(grafana_dir()).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "json") {
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            let text = std::fs::read_to_string(&p).unwrap();
            out.insert(name, serde_json::from_str(&text).unwrap());
        }
    }
    assert_eq!(out.len(), 3, "{:?}", out.keys());
    out
}

/// Every panel of a dashboard, rows' own panels included (not the rows).
fn panels(d: &Value) -> Vec<&Value> {
    let mut out = Vec::new();
    for p in d["panels"].as_array().unwrap() {
        if p["type"] == "row" {
            out.extend(p["panels"].as_array().into_iter().flatten());
        } else {
            out.push(p);
        }
    }
    out
}

fn exprs(panel: &Value) -> Vec<&str> {
    panel["targets"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|t| t["expr"].as_str())
        .collect()
}

/// The 0 per node that a query falls back to (`or on (node) …`): not what a panel shows.
const FALLBACK: &str = r#"0 * sum by (node) (dnspath_build_info{node=~"$node"})"#;

/// The families an expression reads, as docs/metrics.md names them.
fn families(expr: &str) -> BTreeSet<String> {
    let expr = &expr.replace(FALLBACK, "");
    let mut out = BTreeSet::new();
    let b = expr.as_bytes();
    let mut i = 0;
    while i < b.len() {
        let rest = &expr[i..];
        let at_word = i == 0 || !(b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_');
        if at_word && (rest.starts_with("dnspath_") || rest.starts_with("process_")) {
            let end = rest
                .find(|c: char| !(c.is_ascii_lowercase() || c == '_'))
                .unwrap_or(rest.len());
            let name = &rest[..end];
            let name = ["_bucket", "_count", "_sum"]
                .iter()
                .find_map(|s| name.strip_suffix(s))
                .unwrap_or(name);
            out.insert(name.to_string());
            i += end;
        } else {
            i += 1;
        }
    }
    out
}

#[test]
fn committed_json_is_what_the_generator_writes() {
    let dir = std::env::temp_dir().join(format!("dnspath-dashboards-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let o = Command::new("python3")
        .arg(grafana_dir().join("dashboards.py"))
        .arg(&dir)
        .output()
        .expect("python3 (`cargo xtask setup` installs it)");
    let written: BTreeMap<String, String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| {
            let p = e.unwrap().path();
            (
                p.file_name().unwrap().to_string_lossy().into_owned(),
                std::fs::read_to_string(&p).unwrap(),
            )
        })
        .collect();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        o.status.success(),
        "deploy/grafana/dashboards.py failed (the Grafana Foundation SDK is installed by \
         `cargo xtask setup`): {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let committed = dashboards();
    assert_eq!(
        written.keys().collect::<Vec<_>>(),
        committed.keys().collect::<Vec<_>>()
    );
    for (name, text) in &written {
        let on_disk = std::fs::read_to_string(grafana_dir().join(name)).unwrap();
        assert!(
            *text == on_disk,
            "deploy/grafana/{name} is not what dashboards.py writes: edit dashboards.py and run \
             `python3 deploy/grafana/dashboards.py`, never the JSON"
        );
    }
    // What Grafana needs of each: variables for the datasource and the node, no uid of a
    // datasource written down, the alerts as annotations.
    for (name, d) in &committed {
        let vars: Vec<&str> = d["templating"]["list"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v["name"].as_str().unwrap())
            .collect();
        assert!(
            vars.contains(&"datasource") && vars.contains(&"node"),
            "{name}: {vars:?}"
        );
        let text = d.to_string();
        let uids: BTreeSet<&str> = text
            .match_indices("\"uid\":\"")
            .map(|(i, m)| {
                let rest = &text[i + m.len()..];
                &rest[..rest.find('"').unwrap()]
            })
            .collect();
        assert!(
            uids.iter()
                .all(|u| *u == "${datasource}" || u.starts_with("dnspath-")),
            "{name}: a datasource uid written down: {uids:?}"
        );
        assert!(
            d["annotations"]["list"]
                .as_array()
                .unwrap()
                .iter()
                .any(|a| a["expr"].as_str().is_some_and(|e| e.contains("ALERTS"))),
            "{name}: no alert annotations"
        );
        for p in panels(d) {
            assert!(!exprs(p).is_empty(), "{name}: {} has no query", p["title"]);
        }
    }
}

/// docs/metrics.md's rows: metric → (its anchor, the "dashboard › panel" names its row
/// gives).
fn documented() -> BTreeMap<String, (bool, Vec<String>)> {
    let doc = std::fs::read_to_string(deploy_dir().join("../docs/metrics.md")).unwrap();
    doc.lines()
        .filter_map(|l| l.strip_prefix("| `"))
        .filter(|l| l.starts_with("dnspath_") || l.starts_with("process_"))
        .map(|l| {
            let name = l.split('`').next().unwrap().to_string();
            let anchor = l.contains(&format!("<a id=\"{name}\"></a>"));
            let cells: Vec<&str> = l.split(" | ").collect();
            let shown: Vec<String> = cells
                .last()
                .unwrap()
                .trim_end_matches('|')
                .split(';')
                .map(|s| s.trim().trim_matches('*').to_string())
                .filter(|s| !s.is_empty())
                .collect();
            (name, (anchor, shown))
        })
        .collect()
}

#[test]
fn docs_link_every_metric_to_a_panel_and_every_panel_to_its_metrics() {
    let docs = documented();
    assert!(docs.len() > 30, "{docs:?}");
    let boards = dashboards();
    // "Dashboard title › panel title" → the families its queries read.
    let mut shown: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for d in boards.values() {
        let title = d["title"]
            .as_str()
            .unwrap()
            .trim_start_matches("dnspath / ");
        for p in panels(d) {
            let key = format!("{title} › {}", p["title"].as_str().unwrap());
            let fams: BTreeSet<String> = exprs(p).iter().flat_map(|e| families(e)).collect();
            // Each panel links to the row of each family it reads.
            let links: BTreeSet<String> = p["links"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|l| l["url"].as_str()?.strip_prefix("${docs}#"))
                .map(String::from)
                .collect();
            assert_eq!(links, fams, "{key}: its links");
            for f in &fams {
                assert!(
                    docs.contains_key(f),
                    "{key} reads {f}, not in docs/metrics.md"
                );
            }
            shown.insert(key, fams);
        }
    }
    for (metric, (anchor, panels)) in &docs {
        assert!(
            *anchor,
            "docs/metrics.md: {metric}'s row has no <a id> anchor"
        );
        assert!(
            !panels.is_empty(),
            "docs/metrics.md: {metric}'s row names no panel"
        );
        for p in panels {
            let fams = shown
                .get(p)
                .unwrap_or_else(|| panic!("{metric}: no panel {p:?} in {:?}", shown.keys()));
            assert!(
                fams.contains(metric),
                "{metric}: panel {p} does not show it"
            );
        }
    }
}

// ---- a real Prometheus scraping two agents ----

const PROMETHEUS: &str = "127.0.0.1:9390";
/// The two agents, as Prometheus labels them (`node`, as deploy/podmonitor.yaml does).
const AGENTS: [(&str, &str); 2] = [("lab-a", "127.0.0.1:9253"), ("lab-b", "127.0.0.1:9254")];
/// The limits the agents' cgroup is given: the DaemonSet's.
const MEMORY_LIMIT: u64 = 384 << 20;
const CPU_LIMIT_CORES: f64 = 1.0;

/// An instant query's series: labels and value.
type Rows = Vec<(BTreeMap<String, String>, f64)>;

fn now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

/// Prometheus started in the lab's node namespace (where the agents listen), its data in a
/// directory of its own; killed by PID and the directory removed on drop.
struct Prometheus {
    ns: String,
    child: Child,
    dir: PathBuf,
}

impl Prometheus {
    fn start(lab: &Lab) -> Prometheus {
        let dir = lab.temp_dir().join("prometheus");
        std::fs::create_dir_all(&dir).unwrap();
        let targets: String = AGENTS
            .iter()
            .map(|(node, at)| {
                format!("      - targets: ['{at}']\n        labels: {{node: {node}}}\n")
            })
            .collect();
        let config = format!(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n\
             rule_files: ['{}']\n\
             scrape_configs:\n  - job_name: dnspath\n    static_configs:\n{targets}",
            deploy_dir().join("alerts.yaml").display()
        );
        let file = dir.join("prometheus.yml");
        std::fs::write(&file, config).unwrap();
        let log = std::fs::File::create(dir.join("prometheus.log")).unwrap();
        let mut cmd = lab.command_in(
            lab.node_ns(),
            &[
                "prometheus",
                &format!("--config.file={}", file.display()),
                &format!("--storage.tsdb.path={}", dir.join("data").display()),
                &format!("--web.listen-address={PROMETHEUS}"),
            ],
        );
        cmd.stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log);
        let child = lab
            .spawn(&mut cmd)
            .expect("prometheus (Debian package `prometheus`; `cargo xtask setup` installs it)");
        let p = Prometheus {
            ns: lab.node_ns().to_string(),
            child,
            dir,
        };
        let t0 = Instant::now();
        while p.get("/-/ready", &[]).0 != 200 {
            assert!(
                t0.elapsed() < Duration::from_secs(30),
                "prometheus not ready: {}",
                std::fs::read_to_string(p.dir.join("prometheus.log")).unwrap_or_default()
            );
            thread::sleep(Duration::from_millis(200));
        }
        p
    }

    /// GET `path` with `params` URL-encoded: (status, body).
    fn get(&self, path: &str, params: &[(&str, String)]) -> (u16, String) {
        let url = format!("http://{PROMETHEUS}{path}");
        let mut args: Vec<String> = ["curl", "-s", "-m", "10", "-G", "-w", "\n%{http_code}"]
            .map(String::from)
            .to_vec();
        for (k, v) in params {
            args.push("--data-urlencode".into());
            args.push(format!("{k}={v}"));
        }
        args.push(url);
        let o = Command::new("ip")
            .args(["netns", "exec", &self.ns])
            .args(&args)
            .stdin(Stdio::null())
            .output()
            .expect("ip netns exec curl");
        let out = String::from_utf8_lossy(&o.stdout).into_owned();
        let (body, code) = out.rsplit_once('\n').unwrap_or(("", "0"));
        (code.trim().parse().unwrap_or(0), body.to_string())
    }

    /// An instant query at `at`: each series' labels and value.
    fn query(&self, expr: &str, at: f64) -> Rows {
        let (code, body) = self.get(
            "/api/v1/query",
            &[("query", expr.to_string()), ("time", format!("{at:.3}"))],
        );
        let v: Value =
            serde_json::from_str(&body).unwrap_or_else(|e| panic!("{expr}: {code} {e}: {body}"));
        assert_eq!(v["status"], "success", "{expr}: {body}");
        let result = &v["data"]["result"];
        let rows = match v["data"]["resultType"].as_str() {
            Some("vector") => result.as_array().unwrap().clone(),
            Some("scalar") => vec![serde_json::json!({"metric": {}, "value": result})],
            other => panic!("{expr}: result type {other:?}: {body}"),
        };
        rows.iter()
            .map(|r| {
                let labels = r["metric"]
                    .as_object()
                    .unwrap()
                    .iter()
                    .map(|(k, v)| (k.clone(), v.as_str().unwrap().to_string()))
                    .collect();
                let value: f64 = r["value"][1].as_str().unwrap().parse().unwrap();
                (labels, value)
            })
            .collect()
    }

    /// Sum of `expr`'s values at `at`.
    fn sum(&self, expr: &str, at: f64) -> f64 {
        self.query(expr, at).iter().map(|(_, v)| v).sum()
    }

    /// Waits until `expr` sums to at least `want` now; the time it did.
    fn wait_for(&self, expr: &str, want: f64, within: Duration) -> f64 {
        let t0 = Instant::now();
        loop {
            let at = now();
            let v = self.sum(expr, at);
            if v >= want {
                return at;
            }
            assert!(
                t0.elapsed() < within,
                "{expr} = {v}, waited {within:?} for {want}"
            );
            thread::sleep(Duration::from_millis(250));
        }
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        // Our own child, by its PID.
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The cgroup(s) the agents run in, with the DaemonSet's limits: one directory on cgroup v2,
/// one per controller on v1.
fn limited_cgroups(prefix: &str) -> Vec<crate::shared::TestCgroup> {
    use crate::shared::TestCgroup;
    let name = format!("dnspath-dash-{prefix}");
    let memory = TestCgroup::new("memory", &name).expect("a memory cgroup");
    if memory.dir.join("memory.max").exists() {
        memory.set("memory.max", &MEMORY_LIMIT.to_string());
        memory.set("cpu.max", "100000 100000");
        return vec![memory];
    }
    memory.set("memory.limit_in_bytes", &MEMORY_LIMIT.to_string());
    let cpu = TestCgroup::new("cpu", &name).expect("a cpu cgroup");
    cpu.set("cpu.cfs_period_us", "100000");
    cpu.set("cpu.cfs_quota_us", "100000");
    vec![memory, cpu]
}

/// A shell line mounting, under a fresh /sys/fs/cgroup, the memory and cpu hierarchies
/// this process is in (v1), or the unified one (v2); then `exec "$@"`.
fn cgroup_mounts() -> String {
    let own = std::fs::read_to_string("/proc/self/cgroup").unwrap();
    let v1: Vec<&str> = own
        .lines()
        .filter_map(|l| l.split(':').nth(1))
        .filter(|c| c.split(',').any(|c| c == "memory" || c == "cpu"))
        .collect();
    let mut sh = String::from("set -e; ");
    if v1.is_empty() {
        sh.push_str("mount -t cgroup2 cgroup2 /sys/fs/cgroup; ");
    } else {
        sh.push_str("mount -t tmpfs cgroup /sys/fs/cgroup; ");
        for c in v1 {
            let d = format!("/sys/fs/cgroup/{c}");
            sh.push_str(&format!("mkdir {d}; mount -t cgroup -o {c} cgroup {d}; "));
            if c != "cpu" && c.split(',').any(|c| c == "cpu") {
                sh.push_str(&format!("ln -s {c} /sys/fs/cgroup/cpu; "));
            }
        }
    }
    sh.push_str("exec \"$@\"");
    sh
}

/// `expr` with the dashboard's variables as a person would set them: one node, the client's
/// namespace, the leg variable's default, and a rate window of `window` seconds.
fn substitute(expr: &str, node: &str, namespace: &str, leg: &str, window: u64) -> String {
    expr.replace("$__rate_interval", &format!("{window}s"))
        .replace("$node", node)
        .replace("$namespace", namespace)
        .replace("$leg", leg)
}

#[test]
fn every_panel_has_data_from_prometheus_scraping_two_agents() {
    let Some(mut lab) = lab() else { return };
    let Some(pods) = KubeletPods::for_test(&lab, Node::Lab) else {
        return;
    };
    let root = pods.host_root.to_str().unwrap().to_string();
    let client_ns = pods.of(Pod::Client).unwrap().namespace.clone();
    let node = lab.node_ns().to_string();
    let cgroups = limited_cgroups(lab.prefix());
    // `ip netns exec` mounts a /sys of the namespace's, without the cgroup mounts a
    // container has: the agents mount the hierarchies again, as a pod sees its own.
    let cgroup_fs = cgroup_mounts();
    let agents: Vec<Tracer> = AGENTS
        .iter()
        .map(|(_, at)| {
            let t = Tracer::start_under(
                &lab,
                &node,
                &["sh", "-c", &cgroup_fs, "sh"],
                &[
                    "agent",
                    "--listen",
                    at,
                    "--namespace-label",
                    "--host-root",
                    &root,
                    "--timeout",
                    "1",
                    "--findings-window",
                    "4",
                ],
                true,
                Duration::from_secs(30),
            )
            .unwrap();
            for c in &cgroups {
                c.add(t.pid());
            }
            t
        })
        .collect();
    let prom = Prometheus::start(&lab);
    let started = now();
    let t0 = Instant::now();
    prom.wait_for(
        r#"count(up{job="dnspath"} == 1)"#,
        2.0,
        Duration::from_secs(30),
    );
    // The agents name the pods at their start-up scan (or a rescan, 500 ms after a change).
    thread::sleep(Duration::from_secs(1));

    // N answered questions, after one that makes the series (a counter's first sample is
    // not an increase).
    let answered = |n: f64| {
        prom.wait_for(
            &format!(
                r#"min(sum by (node) (dnspath_dns_transactions_total{{outcome="answered",qtype="A",namespace="{client_ns}"}}))"#
            ),
            n,
            Duration::from_secs(20),
        )
    };
    crate::shared::dig_ok(&lab, &["+time=2", "+tries=1", "www.lab.test.", "A"]);
    // A server asked directly (the client leg), here and again later: a histogram's first
    // sample is not an increase either.
    let direct = format!("@{}", lab.ip_of(Pod::Dns(0)));
    let ask_directly = |lab: &Lab| {
        crate::shared::dig_ok(lab, &["+time=2", "+tries=1", &direct, "www.lab.test.", "A"]);
    };
    ask_directly(&lab);
    let before = answered(2.0);
    // Scrapes on both sides of the questions: the window's edges are extrapolated from
    // the samples in it, less the longer it is.
    thread::sleep(Duration::from_secs(4));
    const N: usize = 20;
    for _ in 0..N {
        crate::shared::dig_ok(&lab, &["+time=2", "+tries=1", "www.lab.test.", "A"]);
    }
    answered(2.0 + N as f64);
    thread::sleep(Duration::from_secs(4));
    let after_answered = now();

    ask_directly(&lab);
    ask_directly(&lab);
    // Each failure twice, a scrape between: a counter's first sample is not an increase.
    let scraped = |what: &str| {
        prom.wait_for(
            &format!("min(sum by (node) ({what}))"),
            1.0,
            Duration::from_secs(20),
        );
    };
    // Search-list walks: glibc with the pod's resolv.conf (ndots:5), NXDOMAIN under each
    // search domain before the name itself.
    let walk = || {
        let o = lab.exec(lab.client_ns(), &["getent", "ahosts", "www.lab.test"]);
        assert!(o.status.success(), "{o:?}");
    };
    walk();
    scraped("dnspath_dns_search_nxdomain_total");
    walk();
    // Forced conntrack races (docs/lab.md): the A query held after DNAT while the AAAA of
    // the same socket passes.
    let rig = race::RaceRig::install(&lab, 300).unwrap();
    race::force_race(&lab, "dash-race0.lab.test").unwrap();
    scraped("dnspath_conntrack_race_drops_total");
    race::force_race(&lab, "dash-race1.lab.test").unwrap();
    rig.remove().unwrap();
    // A dead upstream: both "CoreDNS" pods forward to a socket nobody reads.
    let hole = Hole::new(&lab).unwrap();
    let to: std::net::SocketAddr = format!("{HOLE_ADDR}:53").parse().unwrap();
    for i in 0..2 {
        lab.reconfigure_dns_pod(
            i,
            DnsPodConfig::new(DnsServerKind::Dnsdist).forwarding_to(to),
        )
        .unwrap();
    }
    let void = |i: usize| {
        let _ = lab.dig(&["+time=1", "+tries=1", &format!("q{i}.void.lab.test."), "A"]);
    };
    void(0);
    // Decided after the timeout (1 s) and the retry grace (1.5 s).
    scraped(r#"dnspath_dns_transactions_total{outcome=~"unanswered|dropped|late"}"#);
    for i in 1..4 {
        void(i);
    }
    prom.wait_for(
        r#"min(sum by (node) (dnspath_dns_transactions_total{outcome=~"unanswered|dropped|late"}))"#,
        4.0,
        Duration::from_secs(20),
    );
    drop(hole);

    // A forwarding loop: both pods forward to their own Service.
    let looping = DnsPodConfig::new(DnsServerKind::Dnsdist).forwarding_to_cluster_ip();
    lab.reconfigure_dns_pod(0, looping.clone()).unwrap();
    lab.reconfigure_dns_pod(1, looping).unwrap();
    let _ = lab.dig(&["+time=1", "+tries=1", "storm.lab.test.", "A"]);
    let looping_at = prom.wait_for(
        "min(sum by (node) (dnspath_forwarding_loops_active))",
        1.0,
        Duration::from_secs(15),
    );
    // The alert rule sees it too: pending (for 1 m), shown by the annotation query.
    let alert_at = prom.wait_for(
        r#"count(ALERTS{alertname="DnspathForwardingLoopActive"})"#,
        1.0,
        Duration::from_secs(10),
    );
    for i in 0..2 {
        lab.reconfigure_dns_pod(i, DnsPodConfig::new(DnsServerKind::Dnsdist))
            .unwrap();
    }
    let t_end_loop = Instant::now();
    loop {
        let at = now();
        if prom.sum("max(dnspath_forwarding_loops_active)", at) == 0.0 {
            break;
        }
        assert!(
            t_end_loop.elapsed() < Duration::from_secs(25),
            "the loop gauge stayed up after the loop ended"
        );
        thread::sleep(Duration::from_millis(250));
    }
    // Two more scrapes after everything.
    thread::sleep(Duration::from_secs(2));
    let end = now();
    let window = (end - started).ceil() as u64 + 2;
    eprintln!("traffic done in {:?}; rate window {window}s", t0.elapsed());

    // The variables' own queries find both nodes and the client's namespace.
    let (_, nodes) = prom.get(
        "/api/v1/label/node/values",
        &[("match[]", "dnspath_build_info".into())],
    );
    for (n, _) in AGENTS {
        assert!(nodes.contains(&format!("\"{n}\"")), "{nodes}");
    }
    let (_, namespaces) = prom.get(
        "/api/v1/label/namespace/values",
        &[(
            "match[]",
            r#"dnspath_dns_transactions_total{node=~"lab-a"}"#.into(),
        )],
    );
    assert!(
        namespaces.contains(&format!("\"{client_ns}\"")),
        "{namespaces}"
    );

    // Every query of every panel, for one node and for all, returns series.
    let boards = dashboards();
    let mut results: BTreeMap<(String, String, usize), Rows> = BTreeMap::new();
    let mut count = 0;
    for (file, d) in &boards {
        let leg_default = d["templating"]["list"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["name"] == "leg")
            .map(|v| {
                v["current"]["value"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|s| s.as_str().unwrap().to_string())
                    .collect::<Vec<_>>()
            })
            .unwrap_or_else(|| vec![String::new()]);
        for p in panels(d) {
            let title = p["title"].as_str().unwrap().to_string();
            // A repeated panel is one panel per value of its variable.
            let legs: Vec<String> = if p["repeat"] == "leg" {
                leg_default.clone()
            } else {
                vec![".*".to_string()]
            };
            for (i, e) in exprs(p).iter().enumerate() {
                for leg in &legs {
                    for node in ["lab-a", ".*"] {
                        let q = substitute(e, node, &client_ns, leg, window);
                        let rows = prom.query(&q, end);
                        count += 1;
                        assert!(
                            !rows.is_empty(),
                            "{file}: \"{title}\" query {i} (node {node}, leg {leg}) has no data:\n{q}"
                        );
                        assert!(
                            rows.iter().all(|(_, v)| !v.is_nan()),
                            "{file}: \"{title}\" query {i}: NaN: {rows:?}\n{q}"
                        );
                        if node == "lab-a" && leg == &legs[0] {
                            results.insert((file.clone(), title.clone(), i), rows);
                        }
                    }
                }
            }
        }
    }
    eprintln!(
        "{count} queries of {} panels, every one with data",
        results.len()
    );
    let at = |file: &str, title: &str, i: usize| -> &Rows {
        results
            .get(&(file.to_string(), title.to_string(), i))
            .unwrap_or_else(|| panic!("no panel {title:?} in {file}"))
    };
    let expr_of = |file: &str, title: &str, i: usize| -> String {
        let p = panels(&boards[file])
            .into_iter()
            .find(|p| p["title"] == title)
            .unwrap_or_else(|| panic!("no panel {title:?} in {file}"));
        exprs(p)[i].to_string()
    };
    let value = |rows: &Rows, k: &str, v: &str| -> f64 {
        rows.iter()
            .filter(|(l, _)| l.get(k).is_some_and(|x| x == v))
            .map(|(_, v)| v)
            .sum()
    };

    // Answered ≈ N: the outcome panel over the N questions' window, per node, times the
    // window's length (rate × seconds = increase, extrapolated to the window's edges).
    let w = (after_answered - before).ceil() as u64 + 1;
    let e = expr_of("cluster-dns.json", "Client questions by outcome", 0);
    for (n, _) in AGENTS {
        let rows = prom.query(&substitute(&e, n, &client_ns, "", w), after_answered);
        let got = value(&rows, "outcome", "answered") * w as f64;
        let n_f = N as f64;
        assert!(
            (n_f - 1.0..=n_f * 1.15 + 1.0).contains(&got),
            "{n}: answered ≈ {N}: {got} over {w}s: {rows:?}"
        );
        // and nothing failed then.
        assert_eq!(
            value(&rows, "outcome", "unanswered") + value(&rows, "outcome", "dropped"),
            0.0,
            "{rows:?}"
        );
    }
    // Failures where they were made.
    let fail = at("cluster-dns.json", "Failed share of client questions", 0);
    assert!(fail.iter().all(|(_, v)| *v > 0.0), "{fail:?}");
    let by_ns = at("drilldown.json", "Failed share by namespace", 0);
    assert!(value(by_ns, "namespace", &client_ns) > 0.0, "{by_ns:?}");
    let nx = at("cluster-dns.json", "NXDOMAIN from search-list expansion", 0);
    assert!(nx.iter().all(|(_, v)| *v > 0.0), "{nx:?}");
    let nx_ns = at("drilldown.json", "Search-list NXDOMAIN by namespace", 0);
    assert!(value(nx_ns, "namespace", &client_ns) > 0.0, "{nx_ns:?}");
    let races = at("cluster-dns.json", "Conntrack race", 0);
    assert!(races.iter().all(|(_, v)| *v > 0.0), "{races:?}");
    let unanswered_legs = at("drilldown.json", "Unanswered queries by leg", 0);
    assert!(
        value(unanswered_legs, "leg", "upstream") > 0.0,
        "{unanswered_legs:?}"
    );
    let answered_at = at("cluster-dns.json", "Client questions by outcome", 0);
    assert!(
        value(answered_at, "outcome", "answered") > 0.0,
        "{answered_at:?}"
    );
    let p99 = at("cluster-dns.json", "Leg latency percentiles", 2);
    for leg in ["service", "upstream", "client"] {
        let v = value(p99, "leg", leg);
        assert!(v > 0.0 && v.is_finite(), "{leg} p99: {p99:?}");
    }
    // The loop panel: non-zero while the loop ran, 0 after.
    let e = expr_of("cluster-dns.json", "Active forwarding loops", 0);
    for (n, _) in AGENTS {
        let q = substitute(&e, n, &client_ns, "", window);
        assert!(
            prom.sum(&q, looping_at) >= 1.0,
            "{n}: loop panel at the loop"
        );
        assert_eq!(prom.sum(&q, end), 0.0, "{n}: loop panel after the loop");
    }
    let detected = at("cluster-dns.json", "Active forwarding loops", 1);
    assert!(value(detected, "kind", "cycle") >= 1.0, "{detected:?}");
    // The annotation query shows the alert the loop made.
    let ann = boards["cluster-dns.json"]["annotations"]["list"][0]["expr"]
        .as_str()
        .unwrap();
    let alerts = prom.query(ann, alert_at);
    assert!(
        alerts.iter().any(|(l, _)| l
            .get("alertname")
            .is_some_and(|a| a == "DnspathForwardingLoopActive")),
        "{alerts:?}"
    );
    // Findings: every kind has its row.
    let findings = at("cluster-dns.json", "Current findings", 0);
    assert!(findings.len() >= 10, "{findings:?}");
    // Agent health: both agents up, their CPU and memory against the cgroup's limits.
    let agents_up = prom.query(r#"up{job="dnspath"}"#, end);
    assert_eq!(agents_up.len(), 2, "{agents_up:?}");
    assert!(agents_up.iter().all(|(_, v)| *v == 1.0), "{agents_up:?}");
    let cpu = at("agent-health.json", "CPU against the limit", 0);
    assert!(cpu[0].1 > 0.0, "{cpu:?}");
    let cpu_limit = at("agent-health.json", "CPU against the limit", 1);
    assert_eq!(cpu_limit[0].1, CPU_LIMIT_CORES, "{cpu_limit:?}");
    let charged = at("agent-health.json", "Memory against the limit", 0)[0].1;
    let resident = at("agent-health.json", "Memory against the limit", 1)[0].1;
    let limit = at("agent-health.json", "Memory against the limit", 2)[0].1;
    assert_eq!(limit, MEMORY_LIMIT as f64);
    assert!(
        charged > 0.0 && resident > 1e6 && resident < limit,
        "charged {charged}, resident {resident}, limit {limit}"
    );
    let packets = at("agent-health.json", "Packets read and summarised", 0);
    assert!(packets[0].1 > 0.0, "{packets:?}");

    drop(prom);
    for a in agents {
        // SAFETY: kill(2) on our own child's PID, not yet reaped.
        unsafe {
            libc::kill(a.pid() as libc::pid_t, libc::SIGTERM);
        }
        let out = a.wait();
        assert!(out.status.success(), "{}", out.stderr);
    }
    drop(cgroups);
    drop(pods);
    eprintln!("done in {:?}", t0.elapsed());
}
