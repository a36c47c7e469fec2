//! Ports a watched port is redirected to, captured without the user naming them: a DNS
//! proxy in a pod (Istio's DNS capture: `iptables -t nat … --dport 53 -j REDIRECT
//! --to-ports 15053` in the pod's namespace) gets its clients' queries on a port of its own,
//! where `--port 53` would not see them. Conntrack says so: the entry of such a query has
//! the port asked as its original destination and the port redirected to as its reply's
//! source, from the client's own namespace (loopback, or the client's address). From that
//! event on the kernel programs capture that port too. Known only once the first such flow
//! is in conntrack: at start from the table's dump, else from its first event, so a
//! question redirected to a port not learnt yet is seen by its (un-NATed) answer alone.
use crate::event::{ConntrackEvent, Proto};

/// At most this many ports are learnt; beyond, a warning, once.
pub(super) const MAX_LEARNED: usize = 64;

/// The ports asked for and those learnt.
pub(super) struct Redirects {
    /// `--port`, sorted.
    watched: Vec<u16>,
    learned: Vec<u16>,
    /// Redirects to further ports seen once `MAX_LEARNED` were learnt.
    pub(super) capped: u64,
}

impl Redirects {
    pub(super) fn new(ports: &[u16]) -> Self {
        let mut watched = ports.to_vec();
        watched.sort_unstable();
        watched.dedup();
        Self {
            watched,
            learned: Vec::new(),
            capped: 0,
        }
    }

    fn watched(&self, port: u16) -> bool {
        self.watched.binary_search(&port).is_ok() || self.learned.contains(&port)
    }

    /// The port `ev` shows a watched port redirected to within its client's own
    /// namespace, when it is not captured yet: to be captured from now on. O(1): a search
    /// of the ports given and of at most [`MAX_LEARNED`] learnt.
    pub(super) fn learn(&mut self, ev: &ConntrackEvent) -> Option<u16> {
        let (orig, reply) = (&ev.orig, &ev.reply);
        let to = reply.src;
        let local = to.ip().is_loopback() || to.ip() == orig.src.ip();
        let redirect = Proto::from_number(orig.proto) != Proto::Ip
            && local
            && to != orig.dst
            && !orig.dst.ip().is_loopback()
            && self.watched.binary_search(&orig.dst.port()).is_ok()
            && !self.watched(to.port());
        if !redirect {
            return None;
        }
        if self.learned.len() >= MAX_LEARNED {
            self.capped += 1;
            return None;
        }
        self.learned.push(to.port());
        Some(to.port())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::fixtures::ct_event as ev;

    #[test]
    fn a_redirect_of_a_watched_port_teaches_its_target_once() {
        let mut r = Redirects::new(&[53]);
        let app = "10.244.1.2:40000";
        // REDIRECT in the pod's nat OUTPUT: to 127.0.0.1:15053.
        let udp = ev(17, (app, "10.96.0.10:53"), ("127.0.0.1:15053", app));
        assert_eq!(r.learn(&udp), Some(15053));
        assert_eq!(r.learn(&udp), None, "learnt once");
        let tcp = ev(6, (app, "10.96.0.10:53"), ("127.0.0.1:15053", app));
        assert_eq!(r.learn(&tcp), None);
        // To the pod's own address (REDIRECT in PREROUTING, a DNAT to itself), over IPv6.
        let v6 = ev(
            17,
            ("[fd00::2]:40000", "[fd00:96::a]:53"),
            ("[::1]:15054", "[fd00::2]:40000"),
        );
        assert_eq!(r.learn(&v6), Some(15054));
        let own = ev(17, (app, "10.96.0.10:53"), ("10.244.1.2:15055", app));
        assert_eq!(r.learn(&own), Some(15055));
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
        assert_eq!(r.capped, 10);
    }
}
