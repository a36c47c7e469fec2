#!/usr/bin/env python3
"""Writes fuzz/seeds/ring_record/: the IP packets of the golden captures as the records
the kernel programs write to the EVENTS ring buffer (tracer-common's PacketHeader and
DropEvent layouts), each after a two-byte little-endian length, as the ring_record target
reads them. Run from the repository's root; the seeds are committed."""
import os, struct, sys

GOLDEN = "tests/golden"
OUT = "fuzz/seeds/ring_record"
SKIP = {1: 14, 101: 0, 113: 16, 276: 20, 228: 0}  # link type -> link header length


def packets(path):
    data = open(path, "rb").read()
    if data[:4] in (b"\xd4\xc3\xb2\xa1", b"\x4d\x3c\xb2\xa1"):
        link = struct.unpack_from("<I", data, 20)[0]
        off = 24
        while off + 16 <= len(data):
            _, _, incl, orig = struct.unpack_from("<IIII", data, off)
            yield link, data[off + 16 : off + 16 + incl]
            off += 16 + incl
        return
    off, links = 0, []
    while off + 12 <= len(data):
        btype, blen = struct.unpack_from("<II", data, off)
        if blen < 12:
            return
        if btype == 1:
            links.append(struct.unpack_from("<H", data, off + 8)[0])
        elif btype == 6:
            iface, _, _, cap, _ = struct.unpack_from("<IIIII", data, off + 8)
            if iface < len(links):
                yield links[iface], data[off + 28 : off + 28 + cap]
        off += blen


def ip(link, frame):
    skip = SKIP.get(link)
    if skip is None:
        return None
    if link == 1 and frame[12:14] == b"\x81\x00":
        skip += 4
    p = frame[skip:]
    return p if p and p[0] >> 4 in (4, 6) else None


def packet_record(i, p):
    hdr = struct.pack("<IIQQIIIHBB", 1, i % 2, 1_000_000_000 + i * 1_000_000, 2 + i % 2,
                      1 + i % 3, len(p), len(p), 0, i % 2, 0)
    return hdr + p


def drop_record(i, p):
    tup = lambda a, b: a + bytes(12) + b"\x9c\x40" + struct.pack("<H", 2) + b + bytes(12) + b"\x00\x35" + bytes([17, 0])
    ct = tup(bytes([10, 0, 0, 1]), bytes([10, 96, 0, 10])) + tup(bytes([10, 244, 0, 5]), bytes([10, 0, 0, 1]))
    data = p[:512]
    ev = struct.pack("<IIQQQIIQ", 2, 0, 1_000_000_000 + i * 1_000_000, 2, 0xffffffff81000000, 6, 1, 0x28)
    ev += ct + bytes([i % 2, 0, 0, 0]) + struct.pack("<III", len(p), len(data), 0)
    return ev + data + bytes(512 - len(data))


def main():
    os.makedirs(OUT, exist_ok=True)
    for name in sorted(os.listdir(GOLDEN)):
        if not name.endswith((".pcap", ".pcapng")):
            continue
        ips = [q for q in (ip(l, f) for l, f in packets(os.path.join(GOLDEN, name))) if q][:24]
        if not ips:
            continue
        out = b""
        for i, p in enumerate(ips):
            r = drop_record(i, p) if i % 7 == 6 else packet_record(i, p)
            out += struct.pack("<H", len(r)) + r
        with open(os.path.join(OUT, name.rsplit(".", 1)[0]), "wb") as f:
            f.write(out)
        print(name, len(ips), "records", len(out), "bytes", file=sys.stderr)


main()
