//! Ports a watched port is redirected to, captured without the user naming them: a DNS
//! proxy in a pod (Istio's DNS capture: `iptables -t nat … --dport 53 -j REDIRECT
//! --to-ports 15053` in the pod's namespace) gets its clients' queries on a port of its own,
//! where `--port 53` would not see them. Conntrack says so: the entry of such a query has
//! the port asked as its original destination and the port redirected to as its reply's
//! source, from the client's own namespace (loopback, or the client's address). From that
//! event on the kernel programs capture that port too, in that namespace only (the pod's,
//! whose conntrack said so): a proxy on 443 or 8080 must not make every namespace's HTTPS
//! a flood of malformed DNS. Known only once the first such flow is in conntrack: at start
//! from the table's dump, else from its first event, so a question redirected to a port
//! not learnt yet is seen by its (un-NATed) answer alone. Forgotten with the namespace.
use crate::{
    event::{ConntrackEvent, Proto},
    output::record::LearntPortStats,
};

/// At most this many (namespace, port) pairs are learnt at once (the kernel's
/// `LEARNT_PORTS`); beyond, each refused is counted, and warned of once.
pub(super) const MAX_LEARNED: usize = tracer_common::MAX_LEARNT_PORTS as usize;

/// A port captured in one namespace only.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Learnt {
    pub(super) netns: u64,
    pub(super) port: u16,
}

/// The ports asked for and those learnt.
pub(super) struct Redirects {
    /// `--port`, sorted: captured in every namespace.
    watched: Vec<u16>,
    learned: Vec<Learnt>,
    /// Pairs learnt over the run (the namespaces gone included).
    pub(super) learnt_total: u64,
    /// Pairs forgotten with their namespace.
    pub(super) forgotten: u64,
    /// Redirects to further ports seen while `MAX_LEARNED` were learnt.
    pub(super) refused: u64,
}

impl Redirects {
    pub(super) fn new(ports: &[u16]) -> Self {
        let mut watched = ports.to_vec();
        watched.sort_unstable();
        watched.dedup();
        Self {
            watched,
            learned: Vec::new(),
            learnt_total: 0,
            forgotten: 0,
            refused: 0,
        }
    }

    /// `stats.learnt_ports`.
    pub(super) fn stats(&self) -> LearntPortStats {
        LearntPortStats {
            captured: self.learned.len() as u64,
            learnt: self.learnt_total,
            forgotten: self.forgotten,
            refused: self.refused,
        }
    }

    fn captured_in(&self, netns: u64, port: u16) -> bool {
        self.watched.binary_search(&port).is_ok() || self.learned.contains(&Learnt { netns, port })
    }

    /// The port `ev` shows a watched port redirected to within its client's own
    /// namespace, with that namespace, when it is not captured there yet: to be captured
    /// there from now on. O(1): a search of the ports given and of at most [`MAX_LEARNED`]
    /// learnt.
    pub(super) fn learn(&mut self, ev: &ConntrackEvent) -> Option<Learnt> {
        let (orig, reply) = (&ev.orig, &ev.reply);
        let to = reply.src;
        let local = to.ip().is_loopback() || to.ip() == orig.src.ip();
        let redirect = Proto::from_number(orig.proto) != Proto::Ip
            && local
            && to != orig.dst
            && to.port() != 0
            && ev.netns != 0
            && !orig.dst.ip().is_loopback()
            && self.watched.binary_search(&orig.dst.port()).is_ok()
            && !self.captured_in(ev.netns, to.port());
        if !redirect {
            return None;
        }
        if self.learned.len() >= MAX_LEARNED {
            self.refused += 1;
            return None;
        }
        let learnt = Learnt {
            netns: ev.netns,
            port: to.port(),
        };
        self.learned.push(learnt);
        self.learnt_total += 1;
        Some(learnt)
    }

    /// Forgets what namespace `netns` taught (it is gone): each port, and whether another
    /// namespace still has it learnt. A redirect of it read after this (its last conntrack
    /// events, queued on another thread when it went) is learnt again and kept until the
    /// end: a namespace cookie is never reused, so that pair matches no packet, and costs
    /// one of the [`MAX_LEARNED`].
    pub(super) fn forget(&mut self, netns: u64) -> Vec<(u16, bool)> {
        let (gone, kept): (Vec<Learnt>, Vec<Learnt>) =
            self.learned.iter().partition(|l| l.netns == netns);
        self.learned = kept;
        self.forgotten += gone.len() as u64;
        gone.iter()
            .map(|l| (l.port, self.learned.iter().any(|k| k.port == l.port)))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::fixtures::ct_event as ev;

    fn ev_in(netns: u64, proto: u8, orig: (&str, &str), reply: (&str, &str)) -> ConntrackEvent {
        ConntrackEvent {
            netns,
            ..ev(proto, orig, reply)
        }
    }

    #[test]
    fn a_redirect_of_a_watched_port_teaches_its_target_once() {
        let mut r = Redirects::new(&[53]);
        let app = "10.244.1.2:40000";
        // REDIRECT in the pod's nat OUTPUT: to 127.0.0.1:15053.
        let udp = ev(17, (app, "10.96.0.10:53"), ("127.0.0.1:15053", app));
        let learnt = |port| Some(Learnt { netns: 1, port });
        assert_eq!(r.learn(&udp), learnt(15053));
        assert_eq!(r.learn(&udp), None, "learnt once");
        let tcp = ev(6, (app, "10.96.0.10:53"), ("127.0.0.1:15053", app));
        assert_eq!(r.learn(&tcp), None);
        // To the pod's own address (REDIRECT in PREROUTING, a DNAT to itself), over IPv6.
        let v6 = ev(
            17,
            ("[fd00::2]:40000", "[fd00:96::a]:53"),
            ("[::1]:15054", "[fd00::2]:40000"),
        );
        assert_eq!(r.learn(&v6), learnt(15054));
        let own = ev(17, (app, "10.96.0.10:53"), ("10.244.1.2:15055", app));
        assert_eq!(r.learn(&own), learnt(15055));
    }

    #[test]
    fn each_namespace_learns_for_itself_and_forgets_when_gone() {
        let mut r = Redirects::new(&[53]);
        let app = "10.244.1.2:40000";
        let redirect = |netns, to| ev_in(netns, 17, (app, "10.96.0.10:53"), (to, app));
        let a = r.learn(&redirect(7, "127.0.0.1:15053"));
        assert_eq!(
            a,
            Some(Learnt {
                netns: 7,
                port: 15053
            })
        );
        // Another pod redirecting to the same port: captured there too, on its own.
        let b = r.learn(&redirect(8, "127.0.0.1:15053"));
        assert_eq!(
            b,
            Some(Learnt {
                netns: 8,
                port: 15053
            })
        );
        assert_eq!(r.learn(&redirect(8, "127.0.0.1:15053")), None);
        assert_eq!(
            r.learn(&redirect(8, "127.0.0.1:8080")).map(|l| l.port),
            Some(8080)
        );
        // A namespace of unknown id (0), and a redirect to port 0: nothing to key it by.
        assert_eq!(r.learn(&redirect(0, "127.0.0.1:15060")), None);
        assert_eq!(r.learn(&redirect(9, "127.0.0.1:0")), None);
        // 8 goes: 15053 is still 7's; 8080 was 8's alone.
        let mut gone = r.forget(8);
        gone.sort_unstable();
        assert_eq!(gone, vec![(8080, false), (15053, true)]);
        assert_eq!(r.forget(7), vec![(15053, false)]);
        assert_eq!(r.forget(7), vec![]);
        assert_eq!(
            r.stats(),
            LearntPortStats {
                captured: 0,
                learnt: 3,
                forgotten: 3,
                refused: 0
            }
        );
        // Learnt again when it comes back (an inode number reused before Linux 5.14).
        assert!(r.learn(&redirect(8, "127.0.0.1:8080")).is_some());
    }

    #[test]
    fn dnat_to_a_pod_unwatched_ports_and_loopback_stubs_teach_nothing() {
        let mut r = Redirects::new(&[53]);
        let app = "10.244.1.2:40000";
        // kube-proxy's DNAT to a CoreDNS pod, on port 53 or another.
        for to in ["10.244.1.3:53", "10.244.1.3:1053"] {
            assert_eq!(r.learn(&ev(17, (app, "10.96.0.10:53"), (to, app))), None);
        }
        // A redirect of a port not watched.
        let other = ev(6, (app, "10.96.0.20:80"), ("127.0.0.1:15001", app));
        assert_eq!(r.learn(&other), None);
        // A loopback stub asked directly: no NAT.
        let stub = ev(
            17,
            ("127.0.0.1:41000", "127.0.0.53:53"),
            ("127.0.0.53:53", "127.0.0.1:41000"),
        );
        assert_eq!(r.learn(&stub), None);
        // Not UDP or TCP.
        assert_eq!(
            r.learn(&ev(132, (app, "10.96.0.10:53"), ("127.0.0.1:15053", app))),
            None
        );
    }

    #[test]
    fn bounded_and_counted() {
        let mut r = Redirects::new(&[53]);
        let app = "10.244.1.2:40000";
        for p in 0..MAX_LEARNED as u16 + 10 {
            let to = format!("127.0.0.1:{}", 20000 + p);
            r.learn(&ev(17, (app, "10.96.0.10:53"), (&to, app)));
        }
        assert_eq!(r.learned.len(), MAX_LEARNED);
        assert_eq!(r.refused, 10);
        // A namespace gone makes room.
        assert_eq!(r.forget(1).len(), MAX_LEARNED);
        let to = "127.0.0.1:30000";
        assert!(r
            .learn(&ev(17, (app, "10.96.0.10:53"), (to, app)))
            .is_some());
    }
}
