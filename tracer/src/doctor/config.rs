//! Parsers of what decides where DNS goes: resolv.conf, and the forward targets of CoreDNS
//! (Corefile), dnsmasq (arguments and conf files), dnsdist (Lua conf, `newServer`) and
//! unbound (`forward-addr`). Pure functions of text: reading a server's files through its
//! `/proc/PID/root` is [`super::node`]'s. Hostile input (any bytes, any length) gives a
//! clear error or is skipped, never a panic.
use std::net::{IpAddr, SocketAddr};

use super::finding::ConfigLine;

/// Longest config file read (a Corefile or dnsmasq.conf is a few KiB).
pub const MAX_CONFIG_BYTES: u64 = 1 << 20;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ConfigError {
    #[error("{file}:{line}: {what}")]
    Line {
        file: String,
        line: usize,
        what: String,
    },
    #[error("{file}: {what}")]
    File { file: String, what: String },
}

/// Where a server sends what it does not answer itself.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    Addr(SocketAddr),
    /// The nameservers of this resolv.conf (a path inside the server's root).
    ResolvConf(String),
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Target::Addr(a) => write!(f, "{a}"),
            Target::ResolvConf(p) => write!(f, "the nameservers of {p}"),
        }
    }
}

/// A forward target and the line that sets it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Forward {
    pub target: Target,
    pub at: ConfigLine,
}

/// The DNS servers whose configs are understood, by program name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ServerKind {
    CoreDns,
    Dnsmasq,
    Dnsdist,
    Unbound,
    SystemdResolved,
}

impl ServerKind {
    /// From `argv[0]` (a path or a name).
    pub fn from_program(argv0: &str) -> Option<ServerKind> {
        let name = argv0.rsplit('/').next().unwrap_or(argv0);
        match name {
            // NodeLocal DNSCache's node-cache is CoreDNS with its `-conf` Corefile.
            "coredns" | "node-cache" => Some(ServerKind::CoreDns),
            "dnsmasq" => Some(ServerKind::Dnsmasq),
            "dnsdist" => Some(ServerKind::Dnsdist),
            "unbound" => Some(ServerKind::Unbound),
            "systemd-resolved" => Some(ServerKind::SystemdResolved),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            ServerKind::CoreDns => "coredns",
            ServerKind::Dnsmasq => "dnsmasq",
            ServerKind::Dnsdist => "dnsdist",
            ServerKind::Unbound => "unbound",
            ServerKind::SystemdResolved => "systemd-resolved",
        }
    }
}

/// A parsed resolv.conf (glibc's reading: the last `search`/`domain` wins, `options` add up).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ResolvConf {
    pub nameservers: Vec<IpAddr>,
    pub search: Vec<String>,
    pub ndots: Option<u32>,
    pub options: Vec<String>,
    /// Lines glibc would ignore, said why.
    pub problems: Vec<String>,
}

pub fn parse_resolv_conf(text: &str) -> ResolvConf {
    let mut r = ResolvConf::default();
    for (i, line) in text.lines().enumerate() {
        let line = line.split(['#', ';']).next().unwrap_or_default();
        let mut words = line.split_whitespace();
        let Some(key) = words.next() else { continue };
        match key {
            "nameserver" => match words.next().map(|w| w.split('%').next().unwrap_or(w)) {
                Some(w) => match w.parse::<IpAddr>() {
                    Ok(ip) => r.nameservers.push(ip),
                    Err(_) => r.problems.push(format!(
                        "line {}: nameserver {w:?} is not an address",
                        i + 1
                    )),
                },
                None => r
                    .problems
                    .push(format!("line {}: nameserver without an address", i + 1)),
            },
            "search" | "domain" => r.search = words.map(str::to_owned).collect(),
            "options" => {
                for o in words {
                    if let Some(n) = o.strip_prefix("ndots:") {
                        match n.parse::<u32>() {
                            // glibc caps it at 15.
                            Ok(n) => r.ndots = Some(n.min(15)),
                            Err(_) => r
                                .problems
                                .push(format!("line {}: {o:?} is not a number of dots", i + 1)),
                        }
                    } else {
                        r.options.push(o.to_owned());
                    }
                }
            }
            _ => {}
        }
    }
    r
}

/// `10.0.0.1`, `10.0.0.1:5353`, `[fd00::1]:53`, `fd00::1`, with `default_port`.
pub fn parse_addr(s: &str, default_port: u16) -> Option<SocketAddr> {
    if let Ok(a) = s.parse::<SocketAddr>() {
        return Some(a);
    }
    let s = s.trim_start_matches('[').trim_end_matches(']');
    s.parse::<IpAddr>()
        .ok()
        .map(|ip| SocketAddr::new(ip, default_port))
}

/// `ADDR` with its port after `sep` (dnsmasq `#`, unbound `@`).
fn parse_addr_sep(s: &str, sep: char) -> Option<SocketAddr> {
    match s.split_once(sep) {
        Some((ip, port)) => Some(SocketAddr::new(ip.parse().ok()?, port.parse().ok()?)),
        None => parse_addr(s, 53),
    }
}

fn at(file: &str, line: usize, text: &str) -> ConfigLine {
    ConfigLine {
        file: file.to_owned(),
        line,
        text: text.trim().chars().take(400).collect(),
    }
}

fn bad(file: &str, line: usize, what: String) -> ConfigError {
    ConfigError::Line {
        file: file.to_owned(),
        line,
        what,
    }
}

/// CoreDNS: every `forward FROM TO...` line of the Corefile (any server block). `TO` is an
/// address (`dns://` optional), `tls://ADDR` (port 853), or a resolv.conf path.
pub fn corefile_forwards(file: &str, text: &str) -> Result<Vec<Forward>, ConfigError> {
    let mut out = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let line = raw.split('#').next().unwrap_or_default();
        let mut words = line.split_whitespace();
        if words.next() != Some("forward") {
            continue;
        }
        if words.next().is_none() {
            return Err(bad(file, i + 1, "`forward` without FROM".into()));
        }
        let mut any = false;
        for w in words.take_while(|w| *w != "{") {
            any = true;
            let target = if w.starts_with('/') {
                Target::ResolvConf(w.to_owned())
            } else if let Some(a) = w.strip_prefix("tls://") {
                Target::Addr(
                    parse_addr(a, 853)
                        .ok_or_else(|| bad(file, i + 1, format!("{w:?} is not an address")))?,
                )
            } else {
                let a = w.strip_prefix("dns://").unwrap_or(w);
                Target::Addr(
                    parse_addr(a, 53)
                        .ok_or_else(|| bad(file, i + 1, format!("{w:?} is not an address")))?,
                )
            };
            out.push(Forward {
                target,
                at: at(file, i + 1, raw),
            });
        }
        if !any {
            return Err(bad(file, i + 1, "`forward` without a target".into()));
        }
    }
    Ok(out)
}

/// dnsmasq's `server=` value: `ADDR[#PORT][@IF]`, `/DOMAIN/.../ADDR`; `/DOMAIN/` (local
/// only) and `#` (the default servers) are no target.
fn dnsmasq_server(value: &str) -> Result<Option<SocketAddr>, String> {
    let v = match value.rsplit_once('/') {
        Some((_, rest)) => rest,
        None => value,
    };
    let v = v.split('@').next().unwrap_or(v);
    if v.is_empty() || v == "#" {
        return Ok(None);
    }
    parse_addr_sep(v, '#')
        .map(Some)
        .ok_or_else(|| format!("server {value:?} is not an address"))
}

/// What dnsmasq's options say about forwarding.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct DnsmasqConf {
    pub forwards: Vec<Forward>,
    pub no_resolv: bool,
    pub resolv_file: Option<String>,
    /// `-C`/`--conf-file` given (else /etc/dnsmasq.conf is read if there).
    pub conf_files: Vec<String>,
}

impl DnsmasqConf {
    /// Forwards including the resolv.conf dnsmasq reads unless `no-resolv`.
    pub fn targets(&self, file: &str) -> Vec<Forward> {
        let mut out = self.forwards.clone();
        if !self.no_resolv {
            let rf = self
                .resolv_file
                .clone()
                .unwrap_or_else(|| "/etc/resolv.conf".to_owned());
            out.push(Forward {
                target: Target::ResolvConf(rf.clone()),
                at: at(file, 0, "(no `no-resolv`: reads the resolv-file)"),
            });
        }
        out
    }

    fn option(&mut self, key: &str, value: Option<&str>, line: ConfigLine) -> Result<(), String> {
        match key {
            "server" | "S" => {
                let v = value.ok_or("server without a value")?;
                if let Some(a) = dnsmasq_server(v)? {
                    self.forwards.push(Forward {
                        target: Target::Addr(a),
                        at: line,
                    });
                }
            }
            "no-resolv" | "R" => self.no_resolv = true,
            "resolv-file" | "r" => self.resolv_file = value.map(str::to_owned),
            "conf-file" | "C" => {
                if let Some(v) = value {
                    self.conf_files.push(v.to_owned());
                }
            }
            _ => {}
        }
        Ok(())
    }
}

/// dnsmasq's command line (after the program name).
pub fn dnsmasq_args(args: &[String]) -> Result<DnsmasqConf, ConfigError> {
    let mut c = DnsmasqConf::default();
    let mut i = 0;
    while i < args.len() {
        let a = &args[i];
        let line = at("argv", 0, a);
        let err = |what: String| bad("argv", 0, format!("{a:?}: {what}"));
        if let Some(long) = a.strip_prefix("--") {
            let (k, v) = match long.split_once('=') {
                Some((k, v)) => (k, Some(v)),
                None => {
                    // `--server X` takes the next argument for the options with a value.
                    if matches!(long, "server" | "resolv-file" | "conf-file") {
                        i += 1;
                        (long, args.get(i).map(String::as_str))
                    } else {
                        (long, None)
                    }
                }
            };
            c.option(k, v, line).map_err(err)?;
        } else if let Some(short) = a.strip_prefix('-') {
            let mut chars = short.chars();
            if let Some(k) = chars.next() {
                let rest = chars.as_str();
                let v = if matches!(k, 'S' | 'r' | 'C') {
                    if rest.is_empty() {
                        i += 1;
                        args.get(i).map(String::as_str)
                    } else {
                        Some(rest)
                    }
                } else {
                    None
                };
                let mut buf = [0; 4];
                c.option(k.encode_utf8(&mut buf), v, line).map_err(err)?;
            }
        }
        i += 1;
    }
    Ok(c)
}

/// A dnsmasq conf file (`key=value` lines, as the long options), into `c`.
pub fn dnsmasq_conf(file: &str, text: &str, c: &mut DnsmasqConf) -> Result<(), ConfigError> {
    for (i, raw) in text.lines().enumerate() {
        let line = raw.split('#').next().unwrap_or_default().trim();
        // `#` ends a comment only at the start of a line or after a space; `server=1.2.3.4#53`.
        let line = if raw.trim_start().starts_with('#') {
            continue;
        } else if raw.contains("server") {
            raw.trim()
        } else {
            line
        };
        if line.is_empty() {
            continue;
        }
        let (k, v) = match line.split_once('=') {
            Some((k, v)) => (k.trim(), Some(v.trim())),
            None => (line, None),
        };
        c.option(k, v, at(file, i + 1, raw))
            .map_err(|what| bad(file, i + 1, what))?;
    }
    Ok(())
}

/// dnsdist: `newServer({address='ADDR', ...})`, `newServer("ADDR")`.
pub fn dnsdist_forwards(file: &str, text: &str) -> Result<Vec<Forward>, ConfigError> {
    let mut out = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let line = raw.split("--").next().unwrap_or_default();
        let mut rest = line;
        while let Some(p) = rest.find("newServer(") {
            rest = &rest[p + "newServer(".len()..];
            let arg = rest.trim_start();
            let value = if let Some(table) = arg.strip_prefix('{') {
                let Some(k) = table.find("address") else {
                    return Err(bad(file, i + 1, "newServer without an address".into()));
                };
                let after = table[k + "address".len()..].trim_start();
                let Some(after) = after.strip_prefix('=') else {
                    return Err(bad(file, i + 1, "newServer address without `=`".into()));
                };
                quoted(after.trim_start())
            } else {
                quoted(arg)
            };
            let Some(value) = value else {
                return Err(bad(file, i + 1, "newServer address is not a string".into()));
            };
            let a = parse_addr(value, 53)
                .ok_or_else(|| bad(file, i + 1, format!("{value:?} is not an address")))?;
            out.push(Forward {
                target: Target::Addr(a),
                at: at(file, i + 1, raw),
            });
        }
    }
    Ok(out)
}

/// The contents of a Lua string literal `'…'` or `"…"` at the start of `s`.
fn quoted(s: &str) -> Option<&str> {
    let q = s.chars().next().filter(|c| *c == '\'' || *c == '"')?;
    let body = &s[1..];
    body.find(q).map(|end| &body[..end])
}

/// unbound: every `forward-addr:` (any forward-zone), `ADDR[@PORT][#TLS-NAME]`.
pub fn unbound_forwards(file: &str, text: &str) -> Result<Vec<Forward>, ConfigError> {
    let mut out = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let line = raw.trim_start();
        if line.starts_with('#') {
            continue;
        }
        let Some(v) = line.strip_prefix("forward-addr:") else {
            continue;
        };
        let v = v.split_whitespace().next().unwrap_or_default();
        let v = v.trim_matches('"');
        let v = v.split('#').next().unwrap_or(v);
        let a = parse_addr_sep(v, '@')
            .ok_or_else(|| bad(file, i + 1, format!("forward-addr {v:?} is not an address")))?;
        out.push(Forward {
            target: Target::Addr(a),
            at: at(file, i + 1, raw),
        });
    }
    Ok(out)
}

/// systemd-resolved's `DNS=` servers (`ADDRESS[:PORT][%INTERFACE][#SERVER_NAME]`, space
/// separated) of the `[Resolve]` section of one resolved.conf (or drop-in), added to `dns`
/// in order: an empty `DNS=` empties the list, as resolved reads it. Values that are not
/// addresses are skipped (resolved ignores them too).
pub fn resolved_conf_dns(file: &str, text: &str, dns: &mut Vec<(SocketAddr, ConfigLine)>) {
    let mut in_resolve = false;
    for (i, raw) in text.lines().enumerate() {
        let line = raw.trim();
        if line.starts_with('#') || line.starts_with(';') || line.is_empty() {
            continue;
        }
        if line.starts_with('[') {
            in_resolve = line == "[Resolve]";
            continue;
        }
        let Some((key, value)) = line.split_once('=') else {
            continue;
        };
        if !in_resolve || key.trim() != "DNS" {
            continue;
        }
        let value = value.trim();
        if value.is_empty() {
            dns.clear();
            continue;
        }
        for v in value.split_whitespace() {
            let v = v.split('#').next().unwrap_or(v);
            let v = v.split('%').next().unwrap_or(v);
            if let Some(a) = parse_addr(v, 53) {
                dns.push((a, at(file, i + 1, raw)));
            }
        }
    }
}

/// The `nameserver` lines of a resolv.conf with their line numbers (`(address, line, text)`).
pub fn resolv_conf_nameserver_lines(text: &str) -> Vec<(IpAddr, usize, String)> {
    text.lines()
        .enumerate()
        .filter_map(|(i, raw)| {
            let line = raw.split(['#', ';']).next().unwrap_or_default();
            let mut w = line.split_whitespace();
            if w.next()? != "nameserver" {
                return None;
            }
            let a = w.next()?;
            let ip = a.split('%').next().unwrap_or(a).parse::<IpAddr>().ok()?;
            Some((ip, i + 1, raw.trim().chars().take(400).collect()))
        })
        .collect()
}

/// The value of `flag FILE`, `flag=FILE` or `-xFILE` in `args`.
pub fn arg_value<'a>(args: &'a [String], flags: &[&str]) -> Option<&'a str> {
    let mut it = args.iter();
    while let Some(a) = it.next() {
        for f in flags {
            if a == f {
                return it.next().map(String::as_str);
            }
            if let Some(v) = a.strip_prefix(f) {
                if let Some(v) = v.strip_prefix('=') {
                    return Some(v);
                }
                if !f.starts_with("--") && !v.is_empty() {
                    return Some(v);
                }
            }
        }
    }
    None
}

#[cfg(test)]
#[path = "config_tests.rs"]
mod tests;
