//! Lookups: transactions of one client (address and namespace) asking a name and its
//! search-list expansions (`name.ns.svc.cluster.local`, …, `name.`) within a window share
//! a lookup id, and each is a step of it.
use std::{collections::HashMap, net::IpAddr};

struct LookupState {
    id: u64,
    /// Names asked so far, lowercase, in order (distinct).
    names: Vec<String>,
    last_ts: u64,
}

/// The recent lookup of each client, bounded.
pub(super) struct Lookups {
    by_client: HashMap<(IpAddr, String), LookupState>,
    /// Search-list steps of one lookup follow each other within this window.
    window_ns: u64,
    max: usize,
}

impl Lookups {
    pub(super) fn new(window_ns: u64, max: usize) -> Self {
        Self {
            by_client: HashMap::new(),
            window_ns,
            max,
        }
    }

    /// The lookup a client's new transaction for `name` belongs to, and its step there: the
    /// client's current lookup if `name` is a search-list sibling of one of its names asked
    /// within the window, else a new lookup with the id `new_id` gives.
    pub(super) fn assign(
        &mut self,
        client: IpAddr,
        netns: &str,
        name: &str,
        ts: u64,
        new_id: impl FnOnce() -> u64,
    ) -> (u64, u32) {
        let window = self.window_ns;
        let key = (client, netns.to_string());
        if let Some(state) = self.by_client.get_mut(&key) {
            let related = state.names.iter().any(|n| same_lookup_names(n, name));
            if related && ts.saturating_sub(state.last_ts) <= window {
                state.last_ts = ts;
                let step = match state.names.iter().position(|n| n == name) {
                    Some(i) => i,
                    None => {
                        state.names.push(name.to_string());
                        state.names.len() - 1
                    }
                };
                return (state.id, step as u32);
            }
        }
        let id = new_id();
        if self.by_client.len() >= self.max {
            // Amortised: prune to at most half, so this runs once per max/2 inserts.
            let horizon = ts.saturating_sub(window);
            self.by_client.retain(|_, s| s.last_ts >= horizon);
            if self.by_client.len() >= self.max / 2 {
                self.by_client.clear();
            }
        }
        self.by_client.insert(
            key,
            LookupState {
                id,
                names: vec![name.to_string()],
                last_ts: ts,
            },
        );
        (id, 0)
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.by_client.len()
    }
}

/// Could `a` and `b` be two steps of one search-list expansion? Both are the name the user
/// typed followed by a search domain (possibly none), and Kubernetes-style search lists are
/// nested (`ns.svc.cluster.local`, `svc.cluster.local`, `cluster.local`): after their common
/// leading labels, one remainder is a trailing part of the other.
pub(super) fn same_lookup_names(a: &str, b: &str) -> bool {
    if a == b {
        return true;
    }
    let la: Vec<&str> = a.trim_end_matches('.').split('.').collect();
    let lb: Vec<&str> = b.trim_end_matches('.').split('.').collect();
    let common = la.iter().zip(&lb).take_while(|(x, y)| x == y).count();
    if common == 0 {
        return false;
    }
    let (ra, rb) = (&la[common..], &lb[common..]);
    ra.ends_with(rb) || rb.ends_with(ra)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEC: u64 = 1_000_000_000;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn search_list_steps_share_a_lookup_within_the_window() {
        let mut l = Lookups::new(3 * SEC, 100);
        let mut next = 10;
        let mut id = || {
            next += 1;
            next
        };
        let c = ip("10.0.0.5");
        let a = l.assign(c, "ns1", "web.default.svc.cluster.local.", 0, &mut id);
        let b = l.assign(c, "ns1", "web.svc.cluster.local.", SEC, &mut id);
        let again = l.assign(c, "ns1", "web.default.svc.cluster.local.", 2 * SEC, &mut id);
        assert_eq!(a, (11, 0));
        assert_eq!(b, (11, 1));
        assert_eq!(again, (11, 0), "a name asked again keeps its step");
        // Another namespace, another name, or too late: a new lookup each.
        assert_eq!(
            l.assign(c, "ns2", "web.svc.cluster.local.", 2 * SEC, &mut id)
                .0,
            12
        );
        assert_eq!(l.assign(c, "ns1", "other.example.", 2 * SEC, &mut id).0, 13);
        assert_eq!(l.assign(c, "ns1", "other.", 9 * SEC, &mut id).0, 14);
    }

    #[test]
    fn lookups_stay_bounded() {
        let mut l = Lookups::new(3 * SEC, 8);
        let mut next = 0;
        for i in 0..100u8 {
            l.assign(ip(&format!("10.0.1.{i}")), "ns", "a.", u64::from(i), || {
                next += 1;
                next
            });
            assert!(l.len() <= 8, "{} lookups kept", l.len());
        }
        assert_eq!(next, 100, "each client its own lookup");
    }

    #[test]
    fn search_domain_steps_are_related_and_other_names_not() {
        assert!(same_lookup_names(
            "www.lab.test.default.svc.cluster.local.",
            "www.lab.test.svc.cluster.local."
        ));
        assert!(same_lookup_names(
            "www.lab.test.cluster.local.",
            "www.lab.test."
        ));
        assert!(!same_lookup_names("api.example.com.", "www.example.com."));
        assert!(!same_lookup_names("www.lab.test.", "www.lab.other."));
    }
}
