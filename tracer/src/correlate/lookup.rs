//! Lookups: transactions of one client (address and namespace) asking a name and its
//! search-list expansions (`name.ns.svc.cluster.local`, …, `name.`) within a window share
//! a lookup id, and each is a step of it. Resolvers (glibc, musl, Go) walk the search list
//! forward, asking A and AAAA of a step and retrying it before the next: a client asking an
//! earlier step again has started the lookup over, and that is a new lookup.
use std::{
    collections::{hash_map::Entry, HashMap},
    net::IpAddr,
    sync::Arc,
};

struct LookupState {
    id: u64,
    /// Names asked so far, lowercase, in order (distinct).
    names: Vec<String>,
    /// The latest step asked (an index into `names`).
    step: usize,
    last_ts: u64,
}

/// The recent lookup of each client, bounded.
pub(super) struct Lookups {
    by_client: HashMap<(IpAddr, Arc<str>), LookupState, super::sip::Sip>,
    /// Search-list steps of one lookup follow each other within this window.
    window_ns: u64,
    max: usize,
}

impl Lookups {
    pub(super) fn new(window_ns: u64, max: usize) -> Self {
        Self {
            by_client: HashMap::default(),
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
        netns: impl Into<Arc<str>>,
        name: &str,
        ts: u64,
        new_id: impl FnOnce() -> u64,
    ) -> (u64, u32) {
        let window = self.window_ns;
        let full = self.by_client.len() >= self.max;
        let new_state = |id| LookupState {
            id,
            names: vec![name.to_string()],
            step: 0,
            last_ts: ts,
        };
        // One hash of the key in the usual case: found, or room for a new one.
        let key = match self.by_client.entry((client, netns.into())) {
            Entry::Occupied(mut e) => {
                let state = e.get_mut();
                let asked = state.names.iter().position(|n| n == name);
                let related = match asked {
                    Some(i) => i >= state.step,
                    None => state.names.iter().any(|n| same_lookup_names(n, name)),
                };
                if related && ts.saturating_sub(state.last_ts) <= window {
                    state.last_ts = ts;
                    let step = asked.unwrap_or_else(|| {
                        state.names.push(name.to_string());
                        state.names.len() - 1
                    });
                    state.step = step;
                    return (state.id, step as u32);
                }
                let id = new_id();
                if !full {
                    // A new lookup in the old one's place: its vector and first name's
                    // buffer reused.
                    state.id = id;
                    state.step = 0;
                    state.last_ts = ts;
                    state.names.truncate(1);
                    match state.names.first_mut() {
                        Some(first) => {
                            first.clear();
                            first.push_str(name);
                        }
                        None => state.names.push(name.to_string()),
                    }
                    return (id, 0);
                }
                // Pruned with its old state still there, then replaced.
                (e.key().clone(), id)
            }
            Entry::Vacant(e) => {
                let id = new_id();
                if !full {
                    e.insert(new_state(id));
                    return (id, 0);
                }
                (e.into_key(), id)
            }
        };
        let (key, id) = key;
        // Amortised: prune to at most half, so this runs once per max/2 inserts.
        let horizon = ts.saturating_sub(window);
        self.by_client.retain(|_, s| s.last_ts >= horizon);
        if self.by_client.len() >= self.max / 2 {
            self.by_client.clear();
        }
        self.by_client.insert(key, new_state(id));
        (id, 0)
    }

    pub(super) fn len(&self) -> usize {
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
    let (a, b) = (a.trim_end_matches('.'), b.trim_end_matches('.'));
    // Walk the leading labels both share; then what is left of each (`None`: no labels).
    let (mut pa, mut pb, mut common) = (0, 0, 0);
    let (ra, rb) = loop {
        let ea = label_end(a, pa);
        let eb = label_end(b, pb);
        if a[pa..ea] != b[pb..eb] {
            break (Some(&a[pa..]), Some(&b[pb..]));
        }
        common += 1;
        let (ra, rb) = (rest(a, ea), rest(b, eb));
        if ra.is_none() || rb.is_none() {
            break (ra, rb);
        }
        (pa, pb) = (ea + 1, eb + 1);
    };
    if common == 0 {
        return false;
    }
    labels_end_with(ra, rb) || labels_end_with(rb, ra)
}

/// Where the label of `s` that starts at `from` ends: at its dot, or at the end. A byte
/// search: labels are short, and `str::find`'s searcher costs more to set up than it
/// saves on them.
fn label_end(s: &str, from: usize) -> usize {
    s.as_bytes()
        .iter()
        .skip(from)
        .position(|&b| b == b'.')
        .map_or(s.len(), |i| from + i)
}

/// What follows the label of `s` that ends at `end` (`None`: it was the last).
fn rest(s: &str, end: usize) -> Option<&str> {
    s.get(end + 1..).filter(|_| end < s.len())
}

/// Are the labels of `suffix` the last labels of `s` (`None`: no labels)?
fn labels_end_with(s: Option<&str>, suffix: Option<&str>) -> bool {
    match (s, suffix) {
        (_, None) => true,
        (None, Some(_)) => false,
        (Some(s), Some(x)) => s == x || s.strip_suffix(x).is_some_and(|p| p.ends_with('.')),
    }
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
        let retry = l.assign(c, "ns1", "web.svc.cluster.local.", 2 * SEC, &mut id);
        assert_eq!(a, (11, 0));
        assert_eq!(b, (11, 1));
        assert_eq!(
            retry,
            (11, 1),
            "a step asked again (AAAA, a retry) keeps its step"
        );
        // Another namespace, another name, or too late: a new lookup each.
        assert_eq!(
            l.assign(c, "ns2", "web.svc.cluster.local.", 2 * SEC, &mut id)
                .0,
            12
        );
        assert_eq!(l.assign(c, "ns1", "other.example.", 2 * SEC, &mut id).0, 13);
        assert_eq!(l.assign(c, "ns1", "other.", 9 * SEC, &mut id).0, 14);
    }

    /// A client looking the same name up again and again (a loop of `getent`): each walk of
    /// the search list from its first step is a lookup of its own, not one lookup.
    #[test]
    fn the_first_step_asked_again_is_a_new_lookup() {
        let mut l = Lookups::new(3 * SEC, 100);
        let mut next = 0;
        let mut id = || {
            next += 1;
            next
        };
        let c = ip("10.0.0.5");
        let steps = [
            "www.lab.test.default.svc.cluster.local.",
            "www.lab.test.svc.cluster.local.",
            "www.lab.test.cluster.local.",
            "www.lab.test.",
        ];
        for round in 1..=3u64 {
            for (i, name) in steps.iter().enumerate() {
                let ts = round * 100 + i as u64;
                // A and AAAA of each step.
                assert_eq!(l.assign(c, "ns", name, ts, &mut id), (round, i as u32));
                assert_eq!(l.assign(c, "ns", name, ts, &mut id), (round, i as u32));
            }
        }
        // A later step again (its retry) is no new lookup; an earlier one is.
        assert_eq!(l.assign(c, "ns", steps[3], 400, &mut id), (3, 3));
        assert_eq!(l.assign(c, "ns", steps[1], 401, &mut id), (4, 0));
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

    /// `same_lookup_names` as the label lists it means (allocating them).
    fn same_lookup_names_by_labels(a: &str, b: &str) -> bool {
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

    #[test]
    fn related_names_are_those_whose_labels_are() {
        // Every pair of short names of a few labels (empty ones too, and trailing dots).
        let labels = ["", "a", "b", "ab", "svc", "cluster"];
        let mut names = Vec::new();
        for n in 0..=3usize {
            for mut i in 0..labels.len().pow(n as u32) {
                let mut parts = Vec::new();
                for _ in 0..n {
                    parts.push(labels[i % labels.len()]);
                    i /= labels.len();
                }
                let name = parts.join(".");
                names.push(format!("{name}."));
                names.push(format!("{name}.."));
                names.push(name);
            }
        }
        assert!(names.len() > 500);
        let mut related = 0;
        for a in &names {
            for b in &names {
                let want = same_lookup_names_by_labels(a, b);
                assert_eq!(same_lookup_names(a, b), want, "{a:?} {b:?}");
                related += usize::from(want && a != b);
            }
        }
        assert!(related > 1000, "{related} related pairs");
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
