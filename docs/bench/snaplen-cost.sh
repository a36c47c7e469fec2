#!/usr/bin/env bash
# Snaplen cost: N queries for a ~1.2 KB TXT answer through a veth, traced at snaplen 512 and
# 2048: dnspath CPU (utime+stime) and ring-buffer bytes per packet.
# Run as root after `cargo xtask build`; needs dnsmasq and python3. Touches only the two
# namespaces it makes (removed at exit) and the dnsmasq it starts.
set -euo pipefail
OUT=$(mktemp -d)
BIN=${DNSPATH:-$(dirname "$0")/../../target/release/dnspath}
P=snb$$
ip netns add ${P}c; ip netns add ${P}s
ip link add ${P}a netns ${P}c type veth peer name ${P}b netns ${P}s
ip -n ${P}c addr add 10.77.0.1/24 dev ${P}a; ip -n ${P}c link set ${P}a up; ip -n ${P}c link set lo up
ip -n ${P}s addr add 10.77.0.2/24 dev ${P}b; ip -n ${P}s link set ${P}b up; ip -n ${P}s link set lo up
TXT=$(python3 -c "print(','.join(['x'*200]*5))")
ip netns exec ${P}s dnsmasq --no-daemon --no-resolv --no-hosts --port=53 --listen-address=10.77.0.2 --bind-interfaces --edns-packet-max=4096 --txt-record=big.bench.test,$TXT --pid-file=${OUT}/dnsmasq.pid >/dev/null 2>&1 &
DPID=$!
sleep 0.5
cleanup() { kill $DPID 2>/dev/null || true; ip netns del ${P}c; ip netns del ${P}s; rm -rf "$OUT"; }
trap cleanup EXIT
for SNAP in 512 2048; do
  ip netns exec ${P}c $BIN trace -i ${P}a --snaplen $SNAP -o json --view packets > ${OUT}/out.$SNAP 2>${OUT}/err.$SNAP &
  TP=$!
  sleep 2
  ip netns exec ${P}c python3 - <<'PY'
import socket, struct, time
q = struct.pack(">HHHHHH", 1, 0x0100, 1, 0, 0, 1) + b"\x03big\x05bench\x04test\x00" + struct.pack(">HH", 16, 1) + b"\x00\x00\x29\x10\x00\x00\x00\x00\x00\x00\x00"
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(1)
n = 0; t0 = time.time()
while n < 20000:
    s.sendto(q, ("10.77.0.2", 53))
    try:
        s.recv(4096)
    except socket.timeout:
        pass
    n += 1
print("queries", n, "in", round(time.time() - t0, 2), "s")
PY
  sleep 1
  T1=$(awk '{print $14+$15}' /proc/$TP/stat)
  kill -INT $TP; wait $TP || true
  TICKS=$(getconf CLK_TCK)
  python3 - "$SNAP" "$T1" "$TICKS" "$OUT" <<'PY'
import json, sys
snap, ticks, hz, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
recs = [json.loads(l) for l in open(f"{out}/out.{snap}")]
pk = [r for r in recs if r["type"] == "packet"]
st = [r for r in recs if r["type"] == "stats"][-1]
ring = sum(40 + r["caplen"] + 8 for r in pk)
big = [r for r in pk if r["len"] > 1000]
print(f"snaplen {snap}: packets {st['packets']} lost {st['lost']} cut {st['capture_truncated']}; "
      f"ring-buffer bytes/packet {ring/len(pk):.0f} (answers {sum(40+r['caplen']+8 for r in big)/max(1,len(big)):.0f}); "
      f"CPU {ticks/hz*1e6/len(pk):.1f} us/packet ({ticks/hz:.2f} s)")
PY
done
