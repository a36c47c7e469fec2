#!/usr/bin/env bash
# Agent memory over a long run: `dnspath agent` for SECS seconds (default 600) while a client
# sends RATE queries/s (default 3000), every one for a name never asked before, from a pool of
# source ports renewed all the time, through a DNAT'd "Service" address to dnsmasq: 90% get
# an answer (A/AAAA), 8% NXDOMAIN, 2% go to a Service with nothing behind it (unanswered).
# Samples the agent's VmRSS every 10 s and prints first/peak/last, then the table eviction
# counters and traffic totals from a final scrape, and how long SIGTERM took.
#
# Run as root after `cargo xtask build` (or `cargo build --release -p tracer`); needs
# dnsmasq, iptables, curl and python3. Touches only the three namespaces it makes (removed at
# exit) and the processes it starts (ended by PID).
# The agent traces every namespace of the machine; so that other traffic on a shared machine
# (someone's forwarding-loop test) does not end up in the figures, it is given a host root
# (`--host-root`) whose /run/netns names only this lab's namespaces and whose /proc is empty.
# ISOLATE=0 runs it on the real host root instead.
set -euo pipefail
BIN=${DNSPATH:-$(dirname "$0")/../../target/release/dnspath}
SECS=${SECS:-600}
RATE=${RATE:-3000}
P=agm$$
OUT=$(mktemp -d)
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  for n in c n s; do ip netns del ${P}$n 2>/dev/null || true; done
  rm -rf "$OUT"
}
trap cleanup EXIT

# client ${P}c 10.89.1.2 -- ${P}n (node: DNAT, forwarding) -- ${P}s 10.89.2.2 (dnsmasq)
for n in c n s; do ip netns add ${P}$n; ip -n ${P}$n link set lo up; done
ip link add ${P}c0 netns ${P}c type veth peer name ${P}n0 netns ${P}n
ip link add ${P}n1 netns ${P}n type veth peer name ${P}s0 netns ${P}s
ip -n ${P}c addr add 10.89.1.2/24 dev ${P}c0; ip -n ${P}c link set ${P}c0 up
ip -n ${P}c route add default via 10.89.1.1
ip -n ${P}n addr add 10.89.1.1/24 dev ${P}n0; ip -n ${P}n link set ${P}n0 up
ip -n ${P}n addr add 10.89.2.1/24 dev ${P}n1; ip -n ${P}n link set ${P}n1 up
ip netns exec ${P}n sysctl -qw net.ipv4.ip_forward=1
ip -n ${P}s addr add 10.89.2.2/24 dev ${P}s0; ip -n ${P}s link set ${P}s0 up
ip -n ${P}s route add default via 10.89.2.1
ip netns exec ${P}n iptables -t nat -A PREROUTING -d 10.89.0.10 -p udp --dport 53 -j DNAT --to-destination 10.89.2.2:53
ip netns exec ${P}n iptables -t nat -A PREROUTING -d 10.89.0.11 -p udp --dport 53 -j DNAT --to-destination 10.89.2.2:54
ip netns exec ${P}s dnsmasq --no-daemon --no-resolv --no-hosts --port=53 --listen-address=10.89.2.2 \
  --bind-interfaces --address=/bench.test/10.1.2.3 --address=/bench.test/fd00::1 --local=/nx.test/ \
  --dns-forward-max=1000 --pid-file=$OUT/dnsmasq.pid >/dev/null 2>&1 &
PIDS+=($!)

ROOT=/
if [ "${ISOLATE:-1}" = 1 ]; then
  ROOT=$OUT/root
  mkdir -p $ROOT/proc $ROOT/run/netns
  for n in c n s; do ln -s /run/netns/${P}$n $ROOT/run/netns/${P}$n; done
fi
ip netns exec ${P}n "$BIN" agent --listen 127.0.0.1:9253 --host-root $ROOT >$OUT/events 2>$OUT/agent.err &
AP=$!
PIDS+=($AP)
scrape() { ip netns exec ${P}n curl -s -m 5 "http://127.0.0.1:9253/$1"; }
for _ in $(seq 100); do
  [ "$(scrape readyz || true)" = "ready" ] && break
  sleep 0.1
done
[ "$(scrape readyz || true)" = "ready" ] || { echo "agent not ready:"; cat $OUT/agent.err; exit 1; }

(
  T0=$(date +%s)
  while kill -0 $AP 2>/dev/null; do
    S="$(( $(date +%s) - T0 )) $(awk '/^VmRSS:/ {print $2}' /proc/$AP/status) $(awk '{print $14+$15}' /proc/$AP/stat)"
    echo "$S" >>$OUT/rss
    echo "sample: s rss_kib cpu_ticks: $S"
    sleep 10
  done
) &
PIDS+=($!)

ip netns exec ${P}c python3 - "$SECS" "$RATE" <<'PY' &
import random, select, socket, struct, sys, time
secs, rate = float(sys.argv[1]), int(sys.argv[2])
POOL, RENEW = 256, 16  # sockets in use; renewed per second (new source ports)
ep = select.epoll()
socks = []
def new_socket():
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setblocking(False)
    s.bind(("10.89.1.2", 0))
    ep.register(s.fileno(), select.EPOLLIN)
    return s
byfd = {}
for _ in range(POOL):
    s = new_socket(); socks.append(s); byfd[s.fileno()] = s
def query(qid, name, qtype):
    q = struct.pack(">HHHHHH", qid, 0x0100, 1, 0, 0, 0)
    for label in name.split("."):
        q += bytes([len(label)]) + label.encode()
    return q + b"\x00" + struct.pack(">HH", qtype, 1)
sent = answered = n = 0
t0 = time.monotonic(); last_renew = t0; nonce = random.getrandbits(32)
while True:
    now = time.monotonic()
    if now - t0 >= secs:
        break
    due = int((now - t0) * rate) - sent
    for _ in range(max(0, min(due, rate // 10))):
        n += 1
        r = n % 50
        if r == 0:
            name, dst = f"q{n}-{nonce:x}.bench.test", "10.89.0.11"
        elif r <= 4:
            name, dst = f"q{n}-{nonce:x}.nx.test", "10.89.0.10"
        else:
            name, dst = f"q{n}-{nonce:x}.bench.test", "10.89.0.10"
        s = socks[n % POOL]
        try:
            s.sendto(query(n & 0xFFFF, name, 28 if n % 2 else 1), (dst, 53))
            sent += 1
        except OSError:
            pass
    if now - last_renew >= 1:
        last_renew = now
        for i in random.sample(range(POOL), RENEW):
            ep.unregister(socks[i].fileno()); del byfd[socks[i].fileno()]; socks[i].close()
            socks[i] = new_socket(); byfd[socks[i].fileno()] = socks[i]
    for fd, _ in ep.poll(0.002):
        s = byfd.get(fd)
        while s is not None:
            try:
                s.recv(4096); answered += 1
            except OSError:
                break
el = time.monotonic() - t0
print(f"generator: {sent} queries in {el:.0f} s ({sent / el:.0f}/s), {answered} answers")
PY
GP=$!
PIDS+=($GP)
wait $GP
sleep 3  # the last transactions are reported once over
FINAL=$(scrape metrics) || { echo "final scrape failed; agent stderr:"; tail -5 $OUT/agent.err; }
kill -0 $AP || { echo "the agent is gone:"; tail -5 $OUT/agent.err; exit 1; }
T=$(date +%s%N)
kill -TERM $AP
RC=0; wait $AP || RC=$?
STOP_MS=$(( ($(date +%s%N) - T) / 1000000 ))

python3 - "$OUT/rss" "$(getconf CLK_TCK)" <<'PY'
import sys
rows = [tuple(map(int, l.split())) for l in open(sys.argv[1]) if len(l.split()) == 3]
hz = int(sys.argv[2])
t, rss, cpu = zip(*rows)
half = [r for (s, r, _) in rows if s >= t[-1] / 2]
print(f"RSS (VmRSS, {len(rows)} samples every 10 s over {t[-1]} s): first {rss[0]/1024:.1f} MiB, "
      f"at 60 s {next((r for (s, r, _) in rows if s >= 60), rss[-1])/1024:.1f} MiB, peak {max(rss)/1024:.1f} MiB, "
      f"last {rss[-1]/1024:.1f} MiB; second half {min(half)/1024:.1f}-{max(half)/1024:.1f} MiB")
print(f"agent CPU: {cpu[-1]/hz:.1f} s over {t[-1]} s ({100*cpu[-1]/hz/max(1,t[-1]):.0f}% of one core)")
PY
echo "$FINAL" | grep -E '^dnspath_(table_evictions_total|table_entries|events_lost_total|packets_total|dns_transactions_total)' | grep -v ' 0$' || true
echo "exit status $RC after SIGTERM, stopped in ${STOP_MS} ms; event lines: $(wc -l <$OUT/events)"
grep -v '"type":"agent"' $OUT/events | cut -c1-160 | awk '{print "  event: " $0}' | head -5
