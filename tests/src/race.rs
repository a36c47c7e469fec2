//! The conntrack DNAT race (LAB.md "Failure 2"), made deterministic.
//!
//! A query to the ClusterIP is DNAT'ed to a "CoreDNS" pod and then held in an NFQUEUE in
//! the node's `nat POSTROUTING` (after DNAT, before conntrack confirms the entry). While it
//! is held, the same socket sends a query straight to every pod IP; those entries confirm at
//! once, and one of them has exactly the reply tuple the held entry will want
//! (`POD:53 -> client:PORT`). When the held packet is released, `__nf_conntrack_confirm`
//! finds that reply tuple taken and the clash cannot be resolved (the original tuples
//! differ): `insert_failed` +1, `drop` +1, the query is lost.
//!
//! * [`RaceRig`]: the NFQUEUE rule plus a small libnetfilter_queue "holder" program
//!   ([`HOLDER_C`]), compiled once per lab into [`Lab::temp_dir`].
//! * [`force_race`]: one shot from the client pod.
//! * [`ct_stats`]: the node's per-CPU conntrack counters.

use std::fs;
use std::io::{BufRead, BufReader, ErrorKind, Read};
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Output};
use std::time::{Duration, Instant};

use crate::cmd::{find_tool, run};
use crate::{Lab, LabError, Pod};

/// NFQUEUE number [`RaceRig::install`] uses. NFQUEUE instances are per network namespace,
/// so labs running side by side do not collide.
pub const DEFAULT_QUEUE: u16 = 0;

/// How long [`force_race`] waits after the query to the ClusterIP before sending the
/// direct queries to the pods.
pub const DEFAULT_AAAA_DELAY: Duration = Duration::from_millis(50);

/// How long [`force_race`] waits for answers after the direct queries.
pub const DEFAULT_ANSWER_WAIT: Duration = Duration::from_millis(1000);

/// Longest hold the holder accepts (it clamps larger values): a packet is never held
/// longer than this, whatever it is.
pub const MAX_HOLD_MS: u32 = 10_000;

/// File name of the compiled holder in [`Lab::temp_dir`].
pub const HOLDER_BIN: &str = "nfq-holder";

/// The holder: `nfq-holder QUEUE HOLD_MS`. Binds NFQUEUE `QUEUE`, gives every packet a
/// deadline of arrival + `HOLD_MS` (clamped to [`MAX_HOLD_MS`]) and issues `NF_ACCEPT` for
/// it at that deadline. The hold is the same for every packet, so arrival order is
/// deadline order and a ring of packet ids is the whole schedule. A packet that arrives
/// while the ring is full is accepted at once, and the queue is fail-open (the kernel
/// accepts what does not fit). Prints `ready ...` on stdout once bound; on SIGTERM or
/// SIGINT accepts everything still held and prints a summary line
/// `held=N immediate=N released_on_exit=N verdict_errors=N enobufs=N`.
/// SIGTERM is blocked except inside `ppoll`, so it can never be missed between a check
/// and a wait.
pub const HOLDER_C: &str = r#"
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <linux/netfilter.h>
#include <libnetfilter_queue/libnetfilter_queue.h>

#define CAP 4096
#define MAX_HOLD_MS 10000

static uint32_t ids[CAP];
static uint64_t due[CAP];
static unsigned head, count;
static uint64_t hold_ms;
static unsigned long long n_held, n_immediate, n_released_on_exit, n_verdict_errors, n_enobufs;
static struct nfq_q_handle *qh;
static volatile sig_atomic_t stop;

static void on_signal(int sig) { (void)sig; stop = 1; }

static uint64_t now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static void accept_id(uint32_t id) {
    if (nfq_set_verdict(qh, id, NF_ACCEPT, 0, NULL) < 0)
        n_verdict_errors++;
}

static int on_packet(struct nfq_q_handle *q, struct nfgenmsg *msg, struct nfq_data *d, void *data) {
    (void)q; (void)msg; (void)data;
    struct nfqnl_msg_packet_hdr *ph = nfq_get_msg_packet_hdr(d);
    if (ph == NULL)
        return 0;
    uint32_t id = ntohl(ph->packet_id);
    if (count == CAP) {
        accept_id(id);
        n_immediate++;
        return 0;
    }
    unsigned slot = (head + count) % CAP;
    ids[slot] = id;
    due[slot] = now_ms() + hold_ms;
    count++;
    n_held++;
    return 0;
}

static void release_due(uint64_t now) {
    while (count > 0 && due[head] <= now) {
        accept_id(ids[head]);
        head = (head + 1) % CAP;
        count--;
    }
}

static unsigned long parse_num(const char *s, const char *what) {
    char *end = NULL;
    errno = 0;
    unsigned long v = strtoul(s, &end, 10);
    if (errno != 0 || end == s || *end != '\0') {
        fprintf(stderr, "nfq-holder: bad %s '%s'\n", what, s);
        exit(2);
    }
    return v;
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s QUEUE HOLD_MS\n", argv[0]);
        return 2;
    }
    unsigned long queue = parse_num(argv[1], "queue number");
    if (queue > 65535) {
        fprintf(stderr, "nfq-holder: queue number %lu > 65535\n", queue);
        return 2;
    }
    hold_ms = parse_num(argv[2], "hold");
    if (hold_ms > MAX_HOLD_MS)
        hold_ms = MAX_HOLD_MS;

    sigset_t block, empty;
    sigemptyset(&empty);
    sigemptyset(&block);
    sigaddset(&block, SIGTERM);
    sigaddset(&block, SIGINT);
    sigprocmask(SIG_BLOCK, &block, NULL);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);

    struct nfq_handle *h = nfq_open();
    if (h == NULL) {
        perror("nfq-holder: nfq_open");
        return 1;
    }
    qh = nfq_create_queue(h, (uint16_t)queue, on_packet, NULL);
    if (qh == NULL) {
        fprintf(stderr, "nfq-holder: cannot bind queue %lu (another program on it?): %s\n",
                queue, strerror(errno));
        nfq_close(h);
        return 1;
    }
    if (nfq_set_mode(qh, NFQNL_COPY_META, 0) < 0) {
        perror("nfq-holder: nfq_set_mode");
        nfq_destroy_queue(qh);
        nfq_close(h);
        return 1;
    }
    nfq_set_queue_maxlen(qh, CAP);
    nfq_set_queue_flags(qh, NFQA_CFG_F_FAIL_OPEN, NFQA_CFG_F_FAIL_OPEN);
    int fd = nfq_fd(h);
    int rcvbuf = 4 << 20;
    setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &rcvbuf, sizeof rcvbuf);

    printf("ready queue=%lu hold_ms=%llu\n", queue, (unsigned long long)hold_ms);
    fflush(stdout);

    static char buf[1 << 16] __attribute__((aligned));
    while (!stop) {
        uint64_t now = now_ms();
        release_due(now);
        uint64_t wait = 1000;
        if (count > 0)
            wait = due[head] > now ? due[head] - now : 0;
        struct timespec to = { (time_t)(wait / 1000), (long)(wait % 1000) * 1000000L };
        struct pollfd p = { fd, POLLIN, 0 };
        int r = ppoll(&p, 1, &to, &empty);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            perror("nfq-holder: ppoll");
            break;
        }
        if (r == 0)
            continue;
        for (;;) {
            ssize_t n = recv(fd, buf, sizeof buf, MSG_DONTWAIT);
            if (n < 0) {
                if (errno == ENOBUFS) {
                    n_enobufs++;
                    continue;
                }
                break;
            }
            nfq_handle_packet(h, buf, (int)n);
        }
    }

    n_released_on_exit = count;
    while (count > 0) {
        accept_id(ids[head]);
        head = (head + 1) % CAP;
        count--;
    }
    printf("held=%llu immediate=%llu released_on_exit=%llu verdict_errors=%llu enobufs=%llu\n",
           n_held, n_immediate, n_released_on_exit, n_verdict_errors, n_enobufs);
    fflush(stdout);
    nfq_destroy_queue(qh);
    nfq_close(h);
    return 0;
}
"#;

/// The client side of one shot: one UDP socket, an A query to the ClusterIP, then after a
/// delay an AAAA query (one id) to every pod IP, then it collects answers. Prints
/// `src_port=`, `a_id=`, `aaaa_id=` and one `answer id=ID from=IP:PORT rcode=N ms=T` line
/// per datagram received. argv: CLUSTER_IP NAME DELAY_MS WAIT_MS POD_IP...
pub const RACE_PY: &str = r#"
import random, select, socket, struct, sys, time
cip, name, delay_ms, wait_ms = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
pods = sys.argv[5:]
qname = b''.join(bytes([len(l)]) + l.encode() for l in name.rstrip('.').split('.')) + b'\0'
def query(qid, qtype):
    return struct.pack('>HHHHHH', qid, 0x0100, 1, 0, 0, 0) + qname + struct.pack('>HH', qtype, 1)
a_id, aaaa_id = random.sample(range(1, 0x10000), 2)
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(('0.0.0.0', 0))
t0 = time.monotonic()
s.sendto(query(a_id, 1), (cip, 53))
print('src_port=%d' % s.getsockname()[1])
print('a_id=%d' % a_id)
print('aaaa_id=%d' % aaaa_id)
time.sleep(delay_ms / 1000.0)
for p in pods:
    s.sendto(query(aaaa_id, 28), (p, 53))
deadline = time.monotonic() + wait_ms / 1000.0
while True:
    left = deadline - time.monotonic()
    if left <= 0:
        break
    r, _, _ = select.select([s], [], [], left)
    if not r:
        break
    try:
        data, (src, sport) = s.recvfrom(4096)
    except OSError:
        continue
    if len(data) < 12:
        continue
    qid, flags = struct.unpack('>HH', data[:4])
    print('answer id=%d from=%s:%d rcode=%d ms=%d' % (qid, src, sport, flags & 15, (time.monotonic() - t0) * 1000))
sys.stdout.flush()
"#;

/// What the holder reported when it stopped.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HolderSummary {
    /// Packets it queued and released at their deadline (or on exit).
    pub held: u64,
    /// Packets accepted at once because its ring was full.
    pub immediate: u64,
    /// Packets still held when it was stopped, accepted then.
    pub released_on_exit: u64,
    /// `nf_queue` verdicts the kernel refused.
    pub verdict_errors: u64,
    /// Netlink receive overflows (packets whose notification was lost).
    pub enobufs: u64,
}

/// One [`force_race`] shot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RaceShot {
    /// The client socket's port (both queries).
    pub src_port: u16,
    /// DNS id of the A query to the ClusterIP.
    pub a_id: u16,
    /// DNS id of the AAAA queries sent straight to the pods.
    pub aaaa_id: u16,
    /// Some answer carried `a_id`.
    pub a_answered: bool,
    /// Some answer carried `aaaa_id`.
    pub aaaa_answered: bool,
    /// How many answers carried `aaaa_id` (one per pod when all answered).
    pub aaaa_answers: usize,
    /// Every answer: (DNS id, source address, source port, rcode, ms since the A was sent).
    pub answers: Vec<(u16, Ipv4Addr, u16, u8, u64)>,
}

/// The NFQUEUE rule in the node's `nat POSTROUTING` plus the holder serving it.
/// [`RaceRig::remove`] (or drop) deletes the rule, then stops the holder, which accepts
/// whatever it still holds.
#[derive(Debug)]
pub struct RaceRig<'a> {
    lab: &'a Lab,
    iptables: PathBuf,
    rule: Vec<String>,
    holder: Option<Child>,
    stdout: Option<BufReader<ChildStdout>>,
    rule_installed: bool,
}

impl<'a> RaceRig<'a> {
    /// Compiles the holder (once per lab), starts it in the node namespace on
    /// [`DEFAULT_QUEUE`] holding each packet `hold_ms` ms, waits until it has bound the
    /// queue, then inserts
    /// `iptables -t nat -I POSTROUTING -p udp --dport 53 -m conntrack --ctorigdst <ClusterIP>
    /// -j NFQUEUE --queue-num <N> --queue-bypass` (bypass: should the holder die, packets
    /// pass instead of being dropped).
    pub fn install(lab: &'a Lab, hold_ms: u32) -> Result<RaceRig<'a>, LabError> {
        Self::install_on_queue(lab, hold_ms, DEFAULT_QUEUE)
    }

    /// [`RaceRig::install`] on NFQUEUE `queue`.
    pub fn install_on_queue(
        lab: &'a Lab,
        hold_ms: u32,
        queue: u16,
    ) -> Result<RaceRig<'a>, LabError> {
        let iptables = find_tool(lab.iptables(), "iptables")?;
        let bin = compile_holder(lab)?;
        let bin_s = bin.to_string_lossy().into_owned();
        let queue_s = queue.to_string();
        let hold_s = hold_ms.min(MAX_HOLD_MS).to_string();
        let mut child = lab.spawn_in(lab.node_ns(), &[&bin_s, &queue_s, &hold_s])?;
        let mut stdout = child.stdout.take().map(BufReader::new);
        let mut line = String::new();
        let read = match stdout.as_mut() {
            Some(r) => r.read_line(&mut line),
            None => Ok(0),
        };
        if !matches!(read, Ok(n) if n > 0 && line.starts_with("ready")) {
            // It failed to bind (and exited), or its stdout is unusable: reap and report.
            let _ = child.kill();
            let out = child.wait_with_output();
            let (status, stderr) = match out {
                Ok(o) => (
                    o.status.to_string(),
                    String::from_utf8_lossy(&o.stderr).trim().to_owned(),
                ),
                Err(e) => ("unknown".to_owned(), e.to_string()),
            };
            return Err(LabError::Command {
                cmd: format!("{bin_s} {queue_s} {hold_s} (in {})", lab.node_ns()),
                status,
                stderr: format!("holder did not report ready ({read:?}, {line:?}): {stderr}"),
            });
        }
        let cip = lab.cluster_ip().to_string();
        let rule: Vec<String> = [
            "POSTROUTING",
            "-p",
            "udp",
            "--dport",
            "53",
            "-m",
            "conntrack",
            "--ctorigdst",
            &cip,
            "-j",
            "NFQUEUE",
            "--queue-num",
            &queue_s,
            "--queue-bypass",
        ]
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
        let mut rig = RaceRig {
            lab,
            iptables,
            rule,
            holder: Some(child),
            stdout,
            rule_installed: false,
        };
        // On error `rig` drops here and stops the holder.
        rig.iptables_rule("-I")?;
        rig.rule_installed = true;
        Ok(rig)
    }

    /// Deletes the rule and stops the holder (SIGTERM; it accepts everything it still
    /// holds). Returns the holder's own account of what it did.
    pub fn remove(mut self) -> Result<HolderSummary, LabError> {
        self.shutdown()
    }

    fn iptables_rule(&self, op: &str) -> Result<(), LabError> {
        let ipt = self.iptables.to_string_lossy().into_owned();
        let mut args: Vec<&str> = vec![&ipt, "-w", "-t", "nat", op];
        args.extend(self.rule.iter().map(String::as_str));
        let out = self.lab.exec(self.lab.node_ns(), &args);
        check(&args, out).map(|_| ())
    }

    fn shutdown(&mut self) -> Result<HolderSummary, LabError> {
        let rule_result = if self.rule_installed {
            self.rule_installed = false;
            self.iptables_rule("-D")
        } else {
            Ok(())
        };
        let summary = self.stop_holder();
        rule_result?;
        summary
    }

    fn stop_holder(&mut self) -> Result<HolderSummary, LabError> {
        let Some(mut child) = self.holder.take() else {
            return Ok(HolderSummary::default());
        };
        let label = format!("{HOLDER_BIN} (pid {})", child.id());
        // The child is not reaped yet, so its PID cannot have been reused.
        if let Ok(pid) = libc::pid_t::try_from(child.id()) {
            // SAFETY: kill(2) with a PID we own and have not reaped.
            unsafe { libc::kill(pid, libc::SIGTERM) };
        }
        let deadline = Instant::now() + Duration::from_secs(3);
        let status = loop {
            match child.try_wait() {
                Ok(Some(s)) => break Some(s),
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(10));
                }
                Ok(None) | Err(_) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    break None;
                }
            }
        };
        let mut rest = String::new();
        if let Some(mut r) = self.stdout.take() {
            let _ = r.read_to_string(&mut rest);
        }
        let mut stderr = String::new();
        if let Some(mut e) = child.stderr.take() {
            let _ = e.read_to_string(&mut stderr);
        }
        match status {
            Some(s) if s.success() => parse_summary(&rest).ok_or_else(|| {
                invalid_data(format!("{label} printed no summary: {rest:?} {stderr:?}"))
            }),
            other => Err(LabError::Command {
                cmd: label,
                status: other.map_or_else(|| "killed after 3 s".to_owned(), |s| s.to_string()),
                stderr: stderr.trim().to_owned(),
            }),
        }
    }
}

impl Drop for RaceRig<'_> {
    fn drop(&mut self) {
        if self.rule_installed || self.holder.is_some() {
            if let Err(e) = self.shutdown() {
                eprintln!("lab {}: removing race rig: {e}", self.lab.prefix());
            }
        }
    }
}

/// Compiles [`HOLDER_C`] into `<temp dir>/nfq-holder` unless it is already there.
fn compile_holder(lab: &Lab) -> Result<PathBuf, LabError> {
    let dir = lab.temp_dir();
    let bin = dir.join(HOLDER_BIN);
    if bin.is_file() {
        return Ok(bin);
    }
    let gcc = find_tool("gcc", "gcc")?;
    if !Path::new("/usr/include/libnetfilter_queue/libnetfilter_queue.h").is_file() {
        return Err(LabError::MissingTool {
            tool: "libnetfilter_queue/libnetfilter_queue.h",
            package: "libnetfilter-queue-dev",
        });
    }
    let src = dir.join("holder.c");
    fs::write(&src, HOLDER_C).map_err(|e| LabError::io(format!("writing {}", src.display()), e))?;
    // Build under a private name and rename: a half-written binary is never run.
    let tmp = dir.join(format!("{HOLDER_BIN}.{}.tmp", std::process::id()));
    let mut c = Command::new(gcc);
    c.arg("-O2")
        .arg("-Wall")
        .arg("-o")
        .arg(&tmp)
        .arg(&src)
        .arg("-lnetfilter_queue");
    run(&mut c, None)?;
    fs::rename(&tmp, &bin).map_err(|e| {
        LabError::io(
            format!("renaming {} to {}", tmp.display(), bin.display()),
            e,
        )
    })?;
    Ok(bin)
}

/// One shot of the race with [`DEFAULT_AAAA_DELAY`] and [`DEFAULT_ANSWER_WAIT`]; see
/// [`force_race_timed`].
pub fn force_race(lab: &Lab, name: &str) -> Result<RaceShot, LabError> {
    force_race_timed(lab, name, DEFAULT_AAAA_DELAY, DEFAULT_ANSWER_WAIT)
}

/// From the client pod, with one UDP socket: an A query for `name` to the ClusterIP:53,
/// `aaaa_delay` later an AAAA query for `name` (one id) to every "CoreDNS" pod IP:53, then
/// collects answers for `wait`. With a [`RaceRig`] installed (hold longer than
/// `aaaa_delay`) the A is lost to an unresolvable conntrack clash.
pub fn force_race_timed(
    lab: &Lab,
    name: &str,
    aaaa_delay: Duration,
    wait: Duration,
) -> Result<RaceShot, LabError> {
    let py = find_tool("python3", "python3")?;
    let py = py.to_string_lossy().into_owned();
    let cip = lab.cluster_ip().to_string();
    let delay = aaaa_delay.as_millis().to_string();
    let wait = wait.as_millis().to_string();
    let pods: Vec<String> = (0..lab.dns_pod_count())
        .map(|i| lab.ip_of(Pod::Dns(i)).to_string())
        .collect();
    let mut args: Vec<&str> = vec![&py, "-c", RACE_PY, &cip, name, &delay, &wait];
    args.extend(pods.iter().map(String::as_str));
    let out = lab.exec(lab.client_ns(), &args);
    let label = format!(
        "python3 race script {cip} {name} {delay} {wait} {}",
        pods.join(" ")
    );
    let stdout = check_labeled(&label, out)?;
    parse_shot(&stdout)
        .ok_or_else(|| invalid_data(format!("{label}: unexpected output {stdout:?}")))
}

fn parse_shot(text: &str) -> Option<RaceShot> {
    let mut src_port = None;
    let mut a_id = None;
    let mut aaaa_id = None;
    let mut answers = Vec::new();
    for line in text.lines() {
        if let Some(v) = line.strip_prefix("src_port=") {
            src_port = v.trim().parse::<u16>().ok();
        } else if let Some(v) = line.strip_prefix("a_id=") {
            a_id = v.trim().parse::<u16>().ok();
        } else if let Some(v) = line.strip_prefix("aaaa_id=") {
            aaaa_id = v.trim().parse::<u16>().ok();
        } else if let Some(rest) = line.strip_prefix("answer ") {
            let mut id = None;
            let mut from = None;
            let mut rcode = None;
            let mut ms = None;
            for kv in rest.split_whitespace() {
                let (k, v) = kv.split_once('=')?;
                match k {
                    "id" => id = v.parse::<u16>().ok(),
                    "from" => {
                        let (ip, port) = v.rsplit_once(':')?;
                        from = Some((ip.parse::<Ipv4Addr>().ok()?, port.parse::<u16>().ok()?));
                    }
                    "rcode" => rcode = v.parse::<u8>().ok(),
                    "ms" => ms = v.parse::<u64>().ok(),
                    _ => {}
                }
            }
            let (ip, port) = from?;
            answers.push((id?, ip, port, rcode?, ms?));
        }
    }
    let (src_port, a_id, aaaa_id) = (src_port?, a_id?, aaaa_id?);
    let aaaa_answers = answers.iter().filter(|a| a.0 == aaaa_id).count();
    Some(RaceShot {
        src_port,
        a_id,
        aaaa_id,
        a_answered: answers.iter().any(|a| a.0 == a_id),
        aaaa_answered: aaaa_answers > 0,
        aaaa_answers,
        answers,
    })
}

/// Per-CPU `(insert_failed, drop, clash_resolve)` of the node namespace's conntrack, from
/// `/proc/net/stat/nf_conntrack` (hex; columns `insert_failed`, `drop`, `clashres`; a
/// kernel without `clashres` reports 0 there).
pub fn ct_stats(lab: &Lab) -> Result<Vec<(u64, u64, u64)>, LabError> {
    let args = ["cat", "/proc/net/stat/nf_conntrack"];
    let out = lab.exec(lab.node_ns(), &args);
    let text = check(&args, out)?;
    parse_ct_stats(&text).map_err(|e| invalid_data(format!("/proc/net/stat/nf_conntrack: {e}")))
}

/// Column sums of [`ct_stats`] rows.
pub fn ct_totals(rows: &[(u64, u64, u64)]) -> (u64, u64, u64) {
    rows.iter()
        .fold((0, 0, 0), |(a, b, c), (x, y, z)| (a + x, b + y, c + z))
}

/// Parses `/proc/net/stat/nf_conntrack`: a header of column names, then one line of hex
/// numbers per CPU.
pub fn parse_ct_stats(text: &str) -> Result<Vec<(u64, u64, u64)>, String> {
    let mut lines = text.lines().filter(|l| !l.trim().is_empty());
    let header: Vec<&str> = lines.next().ok_or("empty")?.split_whitespace().collect();
    let col = |name: &str| header.iter().position(|h| *h == name);
    let insert_failed = col("insert_failed").ok_or("no insert_failed column")?;
    let drop = col("drop").ok_or("no drop column")?;
    let clashres = col("clashres");
    let mut rows = Vec::new();
    for (n, line) in lines.enumerate() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        if fields.len() != header.len() {
            return Err(format!(
                "row {n} has {} fields, header {}",
                fields.len(),
                header.len()
            ));
        }
        let hex = |i: usize| {
            u64::from_str_radix(fields[i], 16).map_err(|e| format!("row {n} {:?}: {e}", fields[i]))
        };
        rows.push((
            hex(insert_failed)?,
            hex(drop)?,
            clashres.map(hex).transpose()?.unwrap_or(0),
        ));
    }
    Ok(rows)
}

fn parse_summary(text: &str) -> Option<HolderSummary> {
    let line = text.lines().rev().find(|l| l.starts_with("held="))?;
    let mut s = HolderSummary::default();
    for kv in line.split_whitespace() {
        let (k, v) = kv.split_once('=')?;
        let v = v.parse::<u64>().ok()?;
        match k {
            "held" => s.held = v,
            "immediate" => s.immediate = v,
            "released_on_exit" => s.released_on_exit = v,
            "verdict_errors" => s.verdict_errors = v,
            "enobufs" => s.enobufs = v,
            _ => {}
        }
    }
    Some(s)
}

fn invalid_data(msg: String) -> LabError {
    LabError::io(
        msg.clone(),
        std::io::Error::new(ErrorKind::InvalidData, msg),
    )
}

fn check(args: &[&str], out: Output) -> Result<String, LabError> {
    check_labeled(&args.join(" "), out)
}

fn check_labeled(label: &str, out: Output) -> Result<String, LabError> {
    if out.status.success() {
        return Ok(String::from_utf8_lossy(&out.stdout).into_owned());
    }
    Err(LabError::Command {
        cmd: label.to_owned(),
        status: out.status.to_string(),
        stderr: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_ct_stats() {
        let text = "entries  clashres found new invalid ignore delete chainlength insert insert_failed drop early_drop icmp_error  expect_new expect_create expect_delete search_restart\n\
0000000a  00000002 00000000 00000000 00000003 00000000 00000000 00000000 00000000 0000000b 0000000c 00000000 00000000  00000000 00000000 00000000 00000000\n\
0000000a  00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000001 00000001 00000000 00000000  00000000 00000000 00000000 00000000\n";
        let rows = parse_ct_stats(text).unwrap();
        assert_eq!(rows, vec![(11, 12, 2), (1, 1, 0)]);
        assert_eq!(ct_totals(&rows), (12, 13, 2));
        assert!(parse_ct_stats("entries found\n1 2\n").is_err());
    }

    #[test]
    fn parses_shot() {
        let out = "src_port=40000\na_id=7\naaaa_id=9\nanswer id=9 from=10.244.1.3:53 rcode=3 ms=52\nanswer id=9 from=10.244.1.4:53 rcode=3 ms=53\n";
        let s = parse_shot(out).unwrap();
        assert_eq!((s.src_port, s.a_id, s.aaaa_id), (40000, 7, 9));
        assert!(!s.a_answered);
        assert!(s.aaaa_answered);
        assert_eq!(s.aaaa_answers, 2);
        assert!(parse_shot("a_id=1\n").is_none());
    }

    #[test]
    fn parses_summary() {
        let s = parse_summary("ready queue=0 hold_ms=300\nheld=10 immediate=0 released_on_exit=1 verdict_errors=0 enobufs=0\n").unwrap();
        assert_eq!(s.held, 10);
        assert_eq!(s.released_on_exit, 1);
    }
}
