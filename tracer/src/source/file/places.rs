//! Where a file's packets were: the namespace and interface of each interface block (in a
//! file dnspath wrote, `netns/ifname`: each namespace gets an id of its own), and the kernel
//! drops such a file holds, read back from their comments and placed there.
use super::*;

impl<R: Read> FileSource<R> {
    /// Names interface `ifindex`. In a file dnspath wrote (`trace -w`: its section header
    /// says so), interfaces are named `netns/ifname` (Linux interface names cannot hold `/`):
    /// each namespace then gets an id of its own, so hops keep the namespaces they were seen
    /// in. Other files' names are taken as they are.
    pub(super) fn learn(&mut self, ifindex: u32, ifname: &str) {
        if !self.by_dnspath {
            self.iface_netns.insert(ifindex, FILE_NETNS);
            if let Ok(mut names) = self.names.write() {
                names.learn(FILE_NETNS, &self.netns_name, ifindex, ifname);
            }
            return;
        }
        if ifname == DROPS_IFNAME {
            self.drops_ifaces.insert(ifindex);
            return;
        }
        let _ = self
            .ifaces_by_name
            .insert(ifname.to_string(), (FILE_NETNS, ifindex));
        let (cookie, ns, ifname) = match ifname.split_once('/') {
            Some((ns, name)) if !ns.is_empty() && !name.is_empty() => (self.netns_id(ns), ns, name),
            _ => (FILE_NETNS, self.netns_name.as_str(), ifname),
        };
        self.iface_netns.insert(ifindex, cookie);
        if let Some(place) = self.ifaces_by_name.get_mut(&format!("{ns}/{ifname}")) {
            place.0 = cookie;
        }
        if let Ok(mut names) = self.names.write() {
            names.learn(cookie, ns, ifindex, ifname);
        }
    }

    /// Where a drop's comment says it happened: the namespace id and ifindex the file's
    /// interface block of that name got, or, for a place no packet was written at, new ones
    /// (ifindexes from [`DROP_PLACES`] up, clear of the file's interface ids).
    fn drop_place(&mut self, netns: &str, ifname: &str) -> (u64, u32) {
        let name = format!("{netns}/{ifname}");
        if let Some(&place) = self.ifaces_by_name.get(&name) {
            return place;
        }
        let ifindex = DROP_PLACES.saturating_add(
            u32::try_from(self.ifaces_by_name.len()).unwrap_or(u32::MAX - DROP_PLACES),
        );
        let cookie = self.netns_id(netns);
        self.iface_netns.insert(ifindex, cookie);
        let _ = self.ifaces_by_name.insert(name, (cookie, ifindex));
        // An empty ifname (a drop with no device, e.g. a socket's queue purged) stays empty.
        if let Ok(mut names) = self.names.write() {
            names.learn(cookie, netns, ifindex, ifname);
        }
        (cookie, ifindex)
    }

    /// The id of the namespace named `ns` in a dnspath-written file (from 1; 0 is
    /// [`FILE_NETNS`]).
    fn netns_id(&mut self, ns: &str) -> u64 {
        let next = u64::try_from(self.netns_ids.len()).unwrap_or(u64::MAX) + 1;
        *self.netns_ids.entry(ns.to_string()).or_insert(next)
    }

    /// A packet on the drops interface: the drop its comment describes, or `None` (counted,
    /// the first remembered) when the comment cannot be read.
    pub(super) fn drop_of(
        &mut self,
        frame: &Frame,
        ip: Range<usize>,
        offset: usize,
    ) -> Option<KernelDrop> {
        let comment = frame
            .comment
            .clone()
            .and_then(|r| self.input.avail().get(r))
            .map(String::from_utf8_lossy);
        let parsed = match comment.as_deref() {
            Some(c) => drops::parse_drop_comment(c),
            None => Err(drops::DropCommentError::NoComment),
        };
        let d = match parsed {
            Ok(d) => d,
            Err(e) => {
                self.skips.unreadable_drops += 1;
                if self.first_unreadable_drop.is_none() {
                    self.first_unreadable_drop = Some(format!(
                        "block {} at byte offset {}: {e}",
                        self.progress.records,
                        self.input.offset()
                    ));
                }
                return None;
            }
        };
        let data = bytes::Bytes::copy_from_slice(self.input.avail().get(ip).unwrap_or(&[]));
        let (netns, ifindex) = self.drop_place(&d.netns, &d.ifname);
        self.drops += 1;
        Some(KernelDrop {
            ts_ns: frame.ts_ns,
            cpu: d.cpu,
            netns,
            ifindex,
            reason: 0,
            location: 0,
            ct: d.ct,
            orig_len: frame
                .wire_len
                .saturating_sub(u32::try_from(offset).unwrap_or(u32::MAX)),
            data,
            confirm_failed: d.named.confirm_failed.unwrap_or(false),
            named: Some(Box::new(d.named)),
        })
    }
}
