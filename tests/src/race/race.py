import random, select, socket, struct, sys, time
cip, name, delay_ms, wait_ms = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
pods = sys.argv[5:]
qname = b''.join(bytes([len(l)]) + l.encode() for l in name.rstrip('.').split('.')) + b'\0'
def query(qid, qtype):
    return struct.pack('>HHHHHH', qid, 0x0100, 1, 0, 0, 0) + qname + struct.pack('>HH', qtype, 1)
a_id, aaaa_id = random.sample(range(1, 0x10000), 2)
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(('0.0.0.0', 0))
t0 = time.monotonic()
s.sendto(query(a_id, 1), (cip, 53))
print('src_port=%d' % s.getsockname()[1])
print('a_id=%d' % a_id)
print('aaaa_id=%d' % aaaa_id)
time.sleep(delay_ms / 1000.0)
for p in pods:
    s.sendto(query(aaaa_id, 28), (p, 53))
deadline = time.monotonic() + wait_ms / 1000.0
while True:
    left = deadline - time.monotonic()
    if left <= 0:
        break
    r, _, _ = select.select([s], [], [], left)
    if not r:
        break
    try:
        data, (src, sport) = s.recvfrom(4096)
    except OSError:
        continue
    if len(data) < 12:
        continue
    qid, flags = struct.unpack('>HH', data[:4])
    print('answer id=%d from=%s:%d rcode=%d ms=%d' % (qid, src, sport, flags & 15, (time.monotonic() - t0) * 1000))
sys.stdout.flush()
