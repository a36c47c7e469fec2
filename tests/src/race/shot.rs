//! One shot of the race from the client pod, and what it saw.
use std::net::Ipv4Addr;
use std::time::Duration;

use super::{check_labeled, invalid_data, DEFAULT_AAAA_DELAY, DEFAULT_ANSWER_WAIT};
use crate::cmd::find_tool;
use crate::{Lab, LabError, Pod};

/// The client side of one shot: one UDP socket, an A query to the ClusterIP, then after a
/// delay an AAAA query (one id) to every pod IP, then it collects answers. Prints
/// `src_port=`, `a_id=`, `aaaa_id=` and one `answer id=ID from=IP:PORT rcode=N ms=T` line
/// per datagram received. argv: CLUSTER_IP NAME DELAY_MS WAIT_MS POD_IP...
pub const RACE_PY: &str = include_str!("race.py");

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

pub(super) fn parse_shot(text: &str) -> Option<RaceShot> {
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
