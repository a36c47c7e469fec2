#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "integration tests fail at the line that broke"
)]
//! The image and the manifests, run for real: every manifest in deploy/ passes
//! `kubernetes-validate --strict`; the image (`lab::image`, what `cargo xtask image` builds)
//! as a debug container finds a forwarding loop in the lab and exits 3, naming the lab's pods
//! (made kubelet-like by `lab::kubelet`, read through `--host-root /host/…`); the DaemonSet's pod
//! template, played as a Pod with `podman kube play` under its own securityContext, serves
//! /metrics and counts the lab's queries; without CAP_SYS_ADMIN it fails with one line
//! naming it. Containers and pods are named after the lab's prefix and removed by name.
//! Root only (but the validation); `--test-threads=1`.
use std::{
    path::{Path, PathBuf},
    process::{Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use lab::{
    image::{self, Image},
    kubelet::{KubeletPods, Node},
    tracer::{dnspath_bin, lab_or_skip as lab},
    watch::{read_all, Finished, Watched},
    DnsPodConfig, DnsServerKind, Lab, LabConfig, Pod,
};
use serde_yaml_ng::Value;

use crate::shared::{deploy_dir, dnsdist_to_cluster_ip};

const METRICS: &str = "http://127.0.0.1:9253";

/// The YAML documents of `path`.
fn documents(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap();
    serde_yaml_ng::Deserializer::from_str(&text)
        .map(|d| serde::Deserialize::deserialize(d).unwrap())
        .filter(|v: &Value| !v.is_null())
        .collect()
}

/// The Prometheus Operator's API group: its objects are checked against its own schema
/// ([`the_podmonitor_passes_the_operators_schema`]), not Kubernetes'.
const OPERATOR_GROUP: &str = "monitoring.coreos.com/";

fn of_operator(d: &Value) -> bool {
    d.get("apiVersion")
        .and_then(Value::as_str)
        .is_some_and(|v| v.starts_with(OPERATOR_GROUP))
}

/// deploy/*.yaml holding Kubernetes objects (the alert rules are Prometheus files; the
/// Operator's objects are checked apart).
fn manifests() -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(deploy_dir())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml" || e == "yml"))
        .filter(|p| {
            let docs = documents(p);
            docs.iter().any(|d| d.get("apiVersion").is_some()) && !docs.iter().any(of_operator)
        })
        .collect();
    v.sort();
    v
}

fn kubernetes_validate(file: &Path) -> std::process::Output {
    Command::new("python3")
        .args(["-m", "kubernetes_validate", "--strict"])
        .arg(file)
        .output()
        .expect("python3 (`cargo xtask setup` installs it)")
}

fn require_kubernetes_validate() -> String {
    let o = Command::new("python3")
        .args(["-m", "kubernetes_validate", "--version"])
        .output();
    match o {
        Ok(o) if o.status.success() => String::from_utf8_lossy(&o.stdout).trim().to_owned(),
        _ => panic!(
            "kubernetes-validate is not installed for python3: run `cargo xtask setup` \
             (pip install kubernetes-validate)"
        ),
    }
}

#[test]
fn every_manifest_passes_kubernetes_validate() {
    let version = require_kubernetes_validate();
    let files = manifests();
    assert!(
        files.iter().any(|f| f.ends_with("daemonset.yaml")),
        "{files:?}"
    );
    for f in &files {
        let o = kubernetes_validate(f);
        let out = format!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
        assert!(
            o.status.success(),
            "kubernetes-validate {version} --strict {}:\n{out}",
            f.display()
        );
        // Every object was checked against a schema, none skipped as unknown.
        let objects = documents(f).len();
        assert_eq!(out.matches(" passed ").count(), objects, "{out}");
        eprintln!("{}", out.trim());
    }
    // The validator does reject: a misspelt field of the DaemonSet fails it.
    let text = std::fs::read_to_string(deploy_dir().join("daemonset.yaml")).unwrap();
    assert!(text.contains("hostNetwork: true"));
    let dir = std::env::temp_dir().join(format!("dnspath-deploy-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let broken = dir.join("daemonset.yaml");
    std::fs::write(
        &broken,
        text.replace("hostNetwork: true", "hostNetwrk: true"),
    )
    .unwrap();
    let o = kubernetes_validate(&broken);
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        !o.status.success(),
        "kubernetes-validate accepted `hostNetwrk`: {}",
        String::from_utf8_lossy(&o.stdout)
    );
}

/// Validates a PodMonitor against the Prometheus Operator's schema (the pydantic models
/// of PyPI's `cloudcoil-models-prometheus-operator`, generated from the Operator's CRDs),
/// strictly: a field the schema does not know is dropped by the model, so the object read
/// back must equal the file's.
const VALIDATE_PODMONITOR: &str = r#"
import json, sys, yaml
from cloudcoil.models.prometheus_operator.v1 import PodMonitor
for doc in yaml.safe_load_all(open(sys.argv[1])):
    if doc is None:
        continue
    back = PodMonitor.model_validate(doc).model_dump(by_alias=True, exclude_unset=True, mode="json")
    if back != doc:
        sys.exit("fields the schema does not know: %s != %s" % (json.dumps(doc), json.dumps(back)))
    print("%s %s passed" % (doc["kind"], doc["metadata"]["name"]))
"#;

fn validate_podmonitor(file: &Path) -> std::process::Output {
    Command::new("python3")
        .args(["-c", VALIDATE_PODMONITOR])
        .arg(file)
        .output()
        .expect("python3 (`cargo xtask setup` installs it)")
}

#[test]
fn the_podmonitor_passes_the_operators_schema() {
    let file = deploy_dir().join("podmonitor.yaml");
    let docs = documents(&file);
    assert!(docs.iter().all(of_operator), "{docs:?}");
    assert_eq!(docs[0]["kind"], "PodMonitor");
    let o = validate_podmonitor(&file);
    let out = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(
        o.status.success() && out.contains("PodMonitor dnspath passed"),
        "deploy/podmonitor.yaml (cloudcoil-models-prometheus-operator, installed by `cargo \
         xtask setup`): {out}"
    );
    // It selects the DaemonSet's pods on a port the pod template names, with the job the
    // alerts expect.
    let pm = &docs[0];
    let ds = daemonset();
    let labels = &ds["spec"]["template"]["metadata"]["labels"];
    for (k, v) in pm["spec"]["selector"]["matchLabels"].as_mapping().unwrap() {
        assert_eq!(&labels[k.as_str().unwrap()], v, "selector {k:?}");
    }
    let port = pm["spec"]["podMetricsEndpoints"][0]["port"]
        .as_str()
        .unwrap();
    let ports = &ds["spec"]["template"]["spec"]["containers"][0]["ports"];
    assert!(
        ports
            .as_sequence()
            .unwrap()
            .iter()
            .any(|p| p["name"] == port),
        "{port}: {ports:?}"
    );
    let job_label = pm["spec"]["jobLabel"].as_str().unwrap();
    assert_eq!(labels[job_label], "dnspath");
    // The check rejects: a misspelt field fails it.
    let text = std::fs::read_to_string(&file).unwrap();
    assert!(text.contains("    - port: metrics"));
    let dir = std::env::temp_dir().join(format!("dnspath-podmonitor-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let broken = dir.join("podmonitor.yaml");
    std::fs::write(
        &broken,
        text.replace("    - port: metrics", "    - prot: metrics"),
    )
    .unwrap();
    let o = validate_podmonitor(&broken);
    let _ = std::fs::remove_dir_all(&dir);
    assert!(!o.status.success(), "`prot` accepted: {o:?}");
}

/// The DaemonSet of deploy/daemonset.yaml.
fn daemonset() -> Value {
    documents(&deploy_dir().join("daemonset.yaml"))
        .into_iter()
        .find(|d| d["kind"] == "DaemonSet")
        .expect("a DaemonSet in deploy/daemonset.yaml")
}

fn container(pod_spec: &mut Value) -> &mut Value {
    &mut pod_spec["containers"][0]
}

/// The DaemonSet's pod template as a Pod named `name` (podman 4.3 plays Pods, not
/// DaemonSets), after `edit` of its spec.
fn pod_from_daemonset(name: &str, edit: impl FnOnce(&mut Value)) -> String {
    let ds = daemonset();
    let template = &ds["spec"]["template"];
    let mut spec = template["spec"].clone();
    // podman 4.3 refuses port mappings with host networking ("PortMappings can only be
    // used with Bridge or slirp4netns networking"), where Kubernetes takes the port as
    // information; the probes then name the port by number.
    let c = container(&mut spec);
    let port = c["ports"][0]["containerPort"].clone();
    assert_eq!(port, Value::from(9253));
    if let Some(m) = c.as_mapping_mut() {
        m.remove("ports");
    }
    for probe in ["livenessProbe", "readinessProbe"] {
        assert_eq!(c[probe]["httpGet"]["port"], "metrics");
        c[probe]["httpGet"]["port"] = port.clone();
    }
    // podman plays no downward API or Secret references: the node's name is given, the
    // OTLP secret and endpoint left out (no Collector here; tests/tests/otlp.rs tests export).
    if let Some(env) = c["env"].as_sequence_mut() {
        env.retain(|e| {
            e["valueFrom"]["secretKeyRef"].is_null()
                && !e["name"].as_str().unwrap_or_default().starts_with("OTEL_")
        });
        for e in env.iter_mut() {
            if !e["valueFrom"]["fieldRef"].is_null() {
                if let Some(m) = e.as_mapping_mut() {
                    m.remove("valueFrom");
                }
                e["value"] = Value::from("lab-node");
            }
        }
    }
    edit(&mut spec);
    let mut metadata = template["metadata"].clone();
    metadata["name"] = Value::from(name);
    let mut pod = serde_yaml_ng::Mapping::new();
    pod.insert("apiVersion".into(), "v1".into());
    pod.insert("kind".into(), "Pod".into());
    pod.insert("metadata".into(), metadata);
    pod.insert("spec".into(), spec);
    serde_yaml_ng::to_string(&Value::Mapping(pod)).unwrap()
}

/// The manifest's node paths (kubelet's pod logs, the recorder's directory) taken from the
/// lab's private kubelet root and temp dir: the machine's own /var/log is not a test's to
/// read, nor /var/lib its to fill.
fn lab_node_paths(spec: &mut Value, host_root: &Path, evidence: &Path) {
    for v in spec["volumes"].as_sequence_mut().unwrap() {
        let path = match v["hostPath"]["path"].as_str() {
            Some("/var/log/pods") => host_root.join("var/log/pods"),
            Some("/var/log/containers") => host_root.join("var/log/containers"),
            Some("/var/lib/dnspath/evidence") => evidence.to_path_buf(),
            _ => continue,
        };
        v["hostPath"]["path"] = Value::from(path.to_str().unwrap());
    }
}

fn capabilities(spec: &Value) -> Vec<String> {
    spec["containers"][0]["securityContext"]["capabilities"]["add"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|c| c.as_str().unwrap().to_owned())
        .collect()
}

#[test]
fn daemonset_runs_this_version_with_listed_capabilities_not_privileged() {
    let ds = daemonset();
    let spec = &ds["spec"]["template"]["spec"];
    let c = &spec["containers"][0];
    let version = env!("CARGO_PKG_VERSION");
    assert_eq!(
        c["image"].as_str(),
        Some(format!("{}:{version}", image::IMAGE).as_str())
    );
    assert_eq!(c["args"][0], "agent");
    assert_eq!(c["securityContext"]["privileged"], Value::Bool(false));
    assert_eq!(c["securityContext"]["capabilities"]["drop"][0], "ALL");
    let caps = capabilities(spec);
    for want in [
        "BPF",
        "PERFMON",
        "NET_ADMIN",
        "SYS_ADMIN",
        "SYS_PTRACE",
        "SYSLOG",
    ] {
        assert!(caps.iter().any(|c| c == want), "{want} missing: {caps:?}");
    }
    assert_eq!(spec["hostNetwork"], Value::Bool(true));
    assert_eq!(spec["hostPID"], Value::Bool(true));
    assert_eq!(c["ports"][0]["name"], "metrics");
    assert_eq!(c["ports"][0]["containerPort"], 9253);
    // Pods are named from kubelet's log directories, mounted read-only; flight-recorder
    // files go to the node.
    for path in [
        "/var/log/pods",
        "/var/log/containers",
        "/var/lib/dnspath/evidence",
    ] {
        let mount = c["volumeMounts"]
            .as_sequence()
            .unwrap()
            .iter()
            .find(|m| m["mountPath"] == path)
            .unwrap_or_else(|| panic!("no mount at {path}"));
        let volume = spec["volumes"]
            .as_sequence()
            .unwrap()
            .iter()
            .find(|v| v["name"] == mount["name"])
            .unwrap_or_else(|| panic!("no volume for {path}"));
        assert_eq!(volume["hostPath"]["path"], path);
        let read_only = mount["readOnly"] == Value::Bool(true);
        assert_eq!(read_only, path.starts_with("/var/log"), "{path}");
    }
    let args: Vec<&str> = c["args"]
        .as_sequence()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(args.contains(&"--namespace-label"), "{args:?}");
    let record = args
        .iter()
        .position(|a| *a == "--record")
        .expect("--record");
    assert_eq!(args.get(record + 1), Some(&"/var/lib/dnspath/evidence"));
    assert_eq!(c["livenessProbe"]["httpGet"]["path"], "/healthz");
    assert_eq!(c["readinessProbe"]["httpGet"]["path"], "/readyz");
    assert_eq!(
        ds["spec"]["template"]["metadata"]["annotations"]["prometheus.io/scrape"],
        "true"
    );
}

// ---- containers ----

/// The image of the binary under test, built unless it exists.
fn built_image() -> Image {
    let img = image::ensure(&dnspath_bin()).unwrap_or_else(|e| panic!("image: {e}"));
    eprintln!(
        "image {} ({}), binary sha256 {}",
        img.reference,
        if img.built { "built" } else { "reused" },
        img.binary_sha256
    );
    img
}

fn podman(args: &[&str]) -> std::process::Output {
    let mut c = image::podman().unwrap();
    c.args(args).output().unwrap()
}

/// Removes the podman container, or pod, of this name when dropped.
struct Remove {
    pod: bool,
    name: String,
}

impl Drop for Remove {
    fn drop(&mut self) {
        let o = if self.pod {
            podman(&["pod", "rm", "--force", "--ignore", &self.name])
        } else {
            podman(&["rm", "--force", "--ignore", &self.name])
        };
        if !o.status.success() {
            eprintln!(
                "removing {}: {}",
                self.name,
                String::from_utf8_lossy(&o.stderr)
            );
        }
    }
}

#[test]
fn debug_container_finds_a_forwarding_loop_and_exits_3_naming_the_pods() {
    let Some(mut lab) = lab(LabConfig::default()) else {
        return;
    };
    // The lab's pods as kubelet's; the container's node is this machine's namespace.
    let Some(pods) = KubeletPods::for_test(&lab, Node::Machine) else {
        return;
    };
    let img = built_image();
    let name = format!("{}-debug", lab.prefix());
    let _remove = Remove {
        pod: false,
        name: name.clone(),
    };
    // The lab's kubelet files are in a private root (its /proc and /run are links to the
    // container's own), found under /host as a node's `/` would be.
    let host_root = Path::new("/host").join(pods.host_root.strip_prefix("/").unwrap());
    // What `kubectl debug node/N --profile=sysadmin` gives: privileged, the node's network
    // and PID namespaces, the host's root at /host. The lab's node and client namespaces
    // have no process of their own: they are found through /run/netns.
    let mut cmd = image::podman().unwrap();
    cmd.args([
        "run",
        "--rm",
        "--name",
        &name,
        "--runtime",
        "runc",
        "--privileged",
        "--net=host",
        "--pid=host",
        "-v",
        "/:/host:ro",
        "-v",
        "/run/netns:/run/netns:ro",
        // As `kubectl debug ... -- dnspath trace ...` runs it: the command replaces the
        // entry point and is found through PATH.
        "--entrypoint",
        "dnspath",
        &img.reference,
        "trace",
        "--all-netns",
        "--host-root",
        host_root.to_str().unwrap(),
        "--until",
        "loop",
        "-o",
        "json",
        "--view",
        "transactions",
    ])
    .stdin(Stdio::null())
    .env("RUST_LOG", "warn");
    let child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut run = Watched::new(child, "podman run", read_all);
    run.wait_for_stderr("dnspath: tracing", Duration::from_secs(60))
        .unwrap();
    // An answered lookup first: the transaction names the client's pod and the CoreDNS pod
    // that answered, inside it and on its veth.
    let out = lab.dig(&["+time=5", "+tries=1", "www.lab.test.", "A"]);
    assert!(out.status.success(), "{out:?}");
    // Transactions are written once answered and quiet (300 ms).
    thread::sleep(Duration::from_secs(1));
    lab.reconfigure_dns_pod(0, dnsdist_to_cluster_ip()).unwrap();
    lab.reconfigure_dns_pod(1, dnsdist_to_cluster_ip()).unwrap();
    let started = Instant::now();
    let _ = lab.dig(&["+time=1", "+tries=1", "storm.lab.test.", "A"]);
    let exited = run.exited_within(Duration::from_secs(60));
    let took = started.elapsed();
    // Stop the storm before anything else can fail.
    lab.reconfigure_dns_pod(0, DnsPodConfig::new(DnsServerKind::Dnsdist))
        .unwrap();
    lab.reconfigure_dns_pod(1, DnsPodConfig::new(DnsServerKind::Dnsdist))
        .unwrap();
    if !exited {
        let _ = podman(&["kill", &name]);
        panic!("the debug container did not exit within 60 s of the loop");
    }
    let Finished {
        status,
        stdout,
        stderr,
    } = run.finish();
    assert_eq!(
        status.and_then(|s| s.code()),
        Some(3),
        "exit code; stderr:\n{stderr}"
    );
    let records: Vec<serde_json::Value> = stdout
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    let label = |p: Pod| pods.of(p).unwrap().label();
    let dns: Vec<String> = (0..lab.dns_pod_count())
        .map(|i| label(Pod::Dns(i)))
        .collect();

    let t = records
        .iter()
        .find(|r| r["type"] == "transaction" && r["question"]["name"] == "www.lab.test.")
        .unwrap_or_else(|| panic!("no transaction for www.lab.test.:\n{stdout}"));
    assert_eq!(t["pod"], label(Pod::Client).as_str(), "{t}");
    let hop_pods: Vec<(&str, bool)> = t["legs"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|leg| leg["hops"].as_array().unwrap())
        .filter_map(|h| Some((h["pod"].as_str()?, h["pod_veth"].as_bool().unwrap_or(false))))
        .collect();
    for veth in [false, true] {
        assert!(
            hop_pods.contains(&(label(Pod::Client).as_str(), veth)),
            "client pod (veth: {veth}) on no hop: {t}"
        );
        assert!(
            hop_pods
                .iter()
                .any(|(p, v)| dns.iter().any(|d| d == p) && *v == veth),
            "CoreDNS pod (veth: {veth}) on no hop: {t}"
        );
    }
    // The hostNetwork pod is in the container's (the machine's) namespace: the node's.
    let host_pod = pods.pods.iter().find(|p| p.pod.is_none()).unwrap();
    assert!(
        !stdout.contains(&host_pod.name),
        "the node's namespace was labelled with the hostNetwork pod {}",
        host_pod.label()
    );

    // Each server of the cycle names the CoreDNS pod it is (the Service's DNAT picks which,
    // so the cycle may close through one pod or both): the servers were restarted, their
    // pods' sandboxes were not.
    let l = records
        .iter()
        .find(|r| {
            r["type"] == "loop"
                && r["question"]["name"] == "storm.lab.test."
                && r["kind"] == "cycle"
        })
        .unwrap_or_else(|| {
            panic!("no loop record for storm.lab.test.:\n{stdout}\nstderr:\n{stderr}")
        });
    let cycle = l["cycle"].as_array().unwrap();
    assert!(!cycle.is_empty(), "{l}");
    let mut cycle_pods = Vec::new();
    for c in cycle {
        let backend = c["backend"].as_str().unwrap();
        let pod = (0..lab.dns_pod_count())
            .map(Pod::Dns)
            .find(|p| backend == format!("{}:53", lab.ip_of(*p)))
            .unwrap_or_else(|| panic!("backend {backend} is no CoreDNS pod: {l}"));
        assert_eq!(c["pod"], label(pod).as_str(), "{l}");
        assert_eq!(c["pod_uid"], pods.of(pod).unwrap().uid.as_str(), "{l}");
        cycle_pods.push(label(pod));
    }
    eprintln!("debug container exited 3 {took:.2?} after the looping query; cycle: {cycle_pods:?}");
}

/// GET `path` from the agent on the host's loopback: (status, body).
fn get(path: &str) -> (u16, String) {
    let o = Command::new("curl")
        .args(["-s", "-m", "5", "-w", "\n%{http_code}"])
        .arg(format!("{METRICS}{path}"))
        .output()
        .expect("curl (`cargo xtask setup` installs it)");
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    let (body, code) = out.rsplit_once('\n').unwrap_or(("", "0"));
    (code.trim().parse().unwrap_or(0), body.to_owned())
}

fn sum(scrape: &str, metric: &str) -> f64 {
    scrape
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            let name = series.split('{').next()?;
            (name == metric)
                .then(|| value.parse::<f64>().ok())
                .flatten()
        })
        .sum()
}

/// `podman inspect` of a container: (status, exit code, pid).
fn state(container: &str) -> (String, i64, u32) {
    let o = podman(&["inspect", container]);
    assert!(
        o.status.success(),
        "podman inspect {container}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let s = &v[0]["State"];
    (
        s["Status"].as_str().unwrap_or_default().to_owned(),
        s["ExitCode"].as_i64().unwrap_or(-1),
        s["Pid"].as_u64().unwrap_or(0) as u32,
    )
}

fn logs(container: &str) -> String {
    let o = podman(&["logs", container]);
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Plays `pod_yaml` (a Pod named `name`) and returns its remover and container name.
fn play(lab: &Lab, name: &str, pod_yaml: &str) -> (Remove, String) {
    let file = lab.temp_dir().join(format!("{name}.yaml"));
    std::fs::write(&file, pod_yaml).unwrap();
    let remove = Remove {
        pod: true,
        name: name.to_owned(),
    };
    let o = podman(&["kube", "play", file.to_str().unwrap()]);
    assert!(
        o.status.success(),
        "podman kube play {}:\n{}{}\n{pod_yaml}",
        file.display(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    (remove, format!("{name}-dnspath"))
}

fn port_9253_free() {
    let o = Command::new("ss")
        .args(["-Hltn", "sport = :9253"])
        .output()
        .unwrap();
    let held = String::from_utf8_lossy(&o.stdout);
    assert!(
        held.trim().is_empty(),
        "port 9253 of the host is taken, the DaemonSet's pod cannot listen there: {held}"
    );
}

/// Bits of capability names (include/uapi/linux/capability.h), as Kubernetes spells them.
fn cap_mask(names: &[String]) -> u64 {
    names
        .iter()
        .map(|n| {
            let bit = match n.as_str() {
                "NET_ADMIN" => 12,
                "SYS_PTRACE" => 19,
                "SYS_ADMIN" => 21,
                "SYS_RESOURCE" => 24,
                "SYSLOG" => 34,
                "PERFMON" => 38,
                "BPF" => 39,
                other => panic!("capability {other} not known to this test"),
            };
            1u64 << bit
        })
        .fold(0, |a, b| a | b)
}

fn effective_capabilities(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let hex = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .unwrap()
        .trim();
    u64::from_str_radix(hex, 16).unwrap()
}

/// (user + system CPU ticks, peak RSS in KiB) of `pid`.
fn usage(pid: u32) -> (u64, u64) {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let after_comm = stat.rsplit_once(')').unwrap().1;
    let f: Vec<&str> = after_comm.split_whitespace().collect();
    // Fields 14 and 15 (utime, stime) of proc(5); `after_comm` starts at field 3.
    let ticks = f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap();
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let hwm = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0);
    (ticks, hwm)
}

#[test]
fn daemonset_pod_serves_metrics_and_counts_the_labs_queries() {
    let Some(lab) = lab(LabConfig::default()) else {
        return;
    };
    // The lab's pods as kubelet's; the pod's node is this machine's namespace.
    let Some(pods) = KubeletPods::for_test(&lab, Node::Machine) else {
        return;
    };
    let img = built_image();
    port_9253_free();
    let name = format!("{}-agent", lab.prefix());
    let evidence = lab.temp_dir().join("evidence");
    std::fs::create_dir_all(&evidence).unwrap();
    let pod = pod_from_daemonset(&name, |spec| {
        assert_eq!(
            container(spec)["image"].as_str(),
            Some(img.reference.as_str())
        );
        lab_node_paths(spec, &pods.host_root, &evidence);
    });
    let (_remove, ctr) = play(&lab, &name, &pod);
    let deadline = Instant::now() + Duration::from_secs(60);
    while get("/readyz").0 != 200 {
        let (status, code, _) = state(&ctr);
        assert!(
            status != "exited" && status != "stopped",
            "agent {status} (exit {code}) before ready:\n{}",
            logs(&ctr)
        );
        assert!(Instant::now() < deadline, "never ready:\n{}", logs(&ctr));
        thread::sleep(Duration::from_millis(200));
    }
    let (code, body) = get("/healthz");
    assert_eq!((code, body.trim()), (200, "ok"));
    let (_, _, pid) = state(&ctr);
    // It runs with the listed capabilities and no others: those suffice.
    let listed: Vec<String> = capabilities(&daemonset()["spec"]["template"]["spec"]);
    assert_eq!(effective_capabilities(pid), cap_mask(&listed), "{listed:?}");
    // Pods are named at the start-up scan, or after a change (then every 500 ms for 3 s).
    thread::sleep(Duration::from_secs(1));
    let (_, before) = get("/metrics");
    let before = sum(&before, "dnspath_dns_transactions_total");

    // Queries through the Service: dig's batch mode, one process. Answered by dnsdist
    // from bind9.
    const QUERIES: usize = 1000;
    let batch = lab.temp_dir().join("batch.txt");
    let names: String = (0..QUERIES)
        .map(|i| format!("q{i}.lab.test. A\n"))
        .collect();
    std::fs::write(&batch, names).unwrap();
    let (ticks0, _) = usage(pid);
    let t0 = Instant::now();
    let o = lab.dig(&["+time=2", "+tries=1", "-f", batch.to_str().unwrap()]);
    let elapsed = t0.elapsed();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let answered = String::from_utf8_lossy(&o.stdout)
        .matches("status: NXDOMAIN")
        .count()
        + String::from_utf8_lossy(&o.stdout)
            .matches("status: NOERROR")
            .count();
    assert!(
        answered >= QUERIES * 9 / 10,
        "{answered} of {QUERIES} answered"
    );
    // Transactions are reported once answered and quiet.
    thread::sleep(Duration::from_secs(3));
    let (ticks1, hwm_kib) = usage(pid);
    let (code, scrape) = get("/metrics");
    assert_eq!(code, 200, "{scrape}");
    let counted = sum(&scrape, "dnspath_dns_transactions_total") - before;
    let hz = 100.0; // USER_HZ
    let cpu = (ticks1 - ticks0) as f64 / hz;
    let wall = elapsed.as_secs_f64() + 3.0;
    eprintln!(
        "agent pod: {answered} queries in {elapsed:.2?} ({:.0}/s); {counted} transactions \
         counted; CPU {cpu:.2} s over {wall:.1} s ({:.0}% of a core, {:.0}% while digging); \
         peak RSS {} MiB",
        answered as f64 / elapsed.as_secs_f64(),
        100.0 * cpu / wall,
        100.0 * cpu / elapsed.as_secs_f64(),
        hwm_kib / 1024
    );
    assert!(
        counted >= answered as f64 * 0.9,
        "{counted} transactions counted for {answered} answered queries"
    );
    // `--namespace-label`: the client pod's questions count under its namespace, named
    // through the mounted pod logs. Pods are found through their processes, so this needs
    // the manifest's `hostPID: true`, which podman 4.3's `kube play` does not apply (the pod
    // gets a PID namespace of its own); the debug container test checks the naming with the
    // host's PIDs.
    let pid_mode = {
        let o = podman(&["inspect", &ctr, "--format", "{{.HostConfig.PidMode}}"]);
        String::from_utf8_lossy(&o.stdout).trim().to_owned()
    };
    let client = pods.of(Pod::Client).unwrap();
    let ns_label = format!("namespace=\"{}\"", client.namespace);
    let by_ns: f64 = scrape
        .lines()
        .filter(|l| l.starts_with("dnspath_dns_queries_total{") && l.contains("leg=\"service\""))
        .filter(|l| l.contains(&ns_label))
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum();
    if pid_mode == "host" {
        assert!(
            by_ns >= answered as f64 * 0.9,
            "{by_ns} service queries under {ns_label} for {answered} answered queries:\n{scrape}"
        );
    } else {
        eprintln!(
            "podman gave the pod PID mode {pid_mode:?}, not the manifest's hostPID: pod names not checked here ({by_ns} queries under {ns_label})"
        );
    }
    // The agent's start event went to the container log.
    let log = logs(&ctr);
    assert!(
        log.lines()
            .any(|l| l.starts_with('{') && l.contains("\"agent\"")),
        "{log}"
    );
}

#[test]
fn daemonset_pod_without_cap_sys_admin_fails_naming_it() {
    let Some(lab) = lab(LabConfig::default()) else {
        return;
    };
    let _img = built_image();
    let name = format!("{}-nocap", lab.prefix());
    let root = lab.temp_dir().join("hostroot");
    for dir in ["var/log/pods", "var/log/containers", "evidence"] {
        std::fs::create_dir_all(root.join(dir)).unwrap();
    }
    let pod = pod_from_daemonset(&name, |spec| {
        lab_node_paths(spec, &root, &root.join("evidence"));
        let caps = &mut container(spec)["securityContext"]["capabilities"]["add"];
        let list = caps.as_sequence_mut().unwrap();
        let n = list.len();
        list.retain(|c| c != "SYS_ADMIN");
        assert_eq!(list.len(), n - 1);
        // A DaemonSet restarts it; here one run is the point.
        spec["restartPolicy"] = Value::from("Never");
        // Not to clash with an agent of another test on the host's port.
        container(spec)["args"][2] = Value::from("127.0.0.1:0");
    });
    let (_remove, ctr) = play(&lab, &name, &pod);
    let deadline = Instant::now() + Duration::from_secs(60);
    let (status, code) = loop {
        let (status, code, _) = state(&ctr);
        if status == "exited" || status == "stopped" {
            break (status, code);
        }
        assert!(
            Instant::now() < deadline,
            "still {status} after 60 s:\n{}",
            logs(&ctr)
        );
        thread::sleep(Duration::from_millis(200));
    };
    let log = logs(&ctr);
    assert_eq!(code, 1, "{status}: {log}");
    let errors: Vec<&str> = log.lines().filter(|l| l.starts_with("dnspath: ")).collect();
    let last = errors.last().copied().unwrap_or_default();
    assert!(
        last.contains("lacks CAP_SYS_ADMIN"),
        "the error does not name the missing capability:\n{log}"
    );
    eprintln!("{last}");
}
