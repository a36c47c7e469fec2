//! Storm shedding in the TC programs (see `tracer_common::shed`): the question hash of a
//! copied UDP packet, and the per-question suppression maps userspace fills once a loop is
//! reported. A shed question's packets are counted per CPU, never copied.
use aya_ebpf::{
    macros::map,
    maps::{Array, HashMap, PerCpuHashMap},
};
use tracer_common::{shed, PACKET_DATA_MASK};

use crate::{count, counter, SHED_ARG, SHED_NAME_BYTES};

/// Storm shedding (see `tracer_common::shed`): question hashes userspace wants only counted.
/// Filled by userspace only, after it created the question's `SHED_COUNT` entry.
#[map]
static SHED_ON: HashMap<u64, u8> = HashMap::with_max_entries(shed::MAX_KEYS, 0);

/// Per question in `SHED_ON`, per CPU: packets counted instead of copied. Userspace creates
/// each entry (zeroed on every CPU) before the question goes into `SHED_ON`, and deletes it
/// only after a last read that follows the question's removal from `SHED_ON`: the counts are
/// exact.
#[map]
static SHED_COUNT: PerCpuHashMap<u64, u64> = PerCpuHashMap::with_max_entries(shed::MAX_KEYS, 0);

/// Slot 0: how many questions `SHED_ON` holds; 0 spares every packet the hashing.
#[map]
static SHED_ACTIVE: Array<u32> = Array::with_max_entries(1, 0);

#[inline(always)]
pub(crate) fn shedding() -> bool {
    matches!(SHED_ACTIVE.get(0), Some(n) if *n != 0)
}

/// Counts the packet instead of copying it if its question is being shed.
#[inline(always)]
pub(crate) fn shed_packet(h: u64) -> bool {
    // SAFETY: presence check only; the value is not read.
    if unsafe { SHED_ON.get(&h) }.is_none() {
        return false;
    }
    let Some(n) = SHED_COUNT.get_ptr_mut(&h) else {
        return false;
    };
    // SAFETY: this CPU's slot; TC programs do not nest on a CPU.
    unsafe { *n += 1 };
    count(counter::PACKETS_SHED);
    true
}

/// `off` as an index of the packet buffer the verifier can bound on every kernel. Offsets
/// here derive from values read back from map memory, whose range LLVM cannot know, so it
/// keeps the mask.
#[inline(always)]
fn data_index(off: usize) -> usize {
    off & PACKET_DATA_MASK
}

/// `tracer_common::shed` hash of the first question of the DNS message at `dns` in
/// `data[..cap]`; `None` if there is none, it is cut, or its name is longer than
/// [`SHED_NAME_BYTES`].
///
/// The name is hashed up to its first zero byte without walking its labels, and every byte
/// of it is lowercased (length bytes are below 64, never ASCII letters): one exit branch per
/// byte, which every verifier since 5.10 follows in a few thousand steps (a label walk
/// multiplied its states). For a name with a zero byte inside a label or a compression
/// pointer this differs from userspace's hash, so such a question is never shed here.
#[inline(always)]
pub(crate) fn question_hash(
    data: &mut [u8; tracer_common::PACKET_DATA_BUF],
    dns: usize,
    cap: usize,
) -> Option<u64> {
    if dns + 12 > cap {
        return None;
    }
    if data[data_index(dns + 4)] | data[data_index(dns + 5)] == 0 {
        return None;
    }
    let mut off = dns + 12;
    let mut h = shed::start();
    let mut ended = false;
    for _ in 0..SHED_NAME_BYTES {
        if off >= cap {
            return None;
        }
        let b = data[data_index(off)];
        off += 1;
        h = shed::step(h, shed::lower(b));
        if b == 0 {
            ended = true;
            break;
        }
    }
    if !ended {
        return None;
    }
    // Through map memory again: the loop leaves at any of 255 offsets, and the rest would be
    // verified once for each.
    // SAFETY: `SHED_ARG..SHED_ARG + 4` is inside `data`, past any packet bytes.
    let off = unsafe {
        let arg = data.as_mut_ptr().add(SHED_ARG) as *mut u32;
        core::ptr::write_volatile(arg, off as u32);
        core::ptr::read_volatile(arg) as usize
    };
    let mut off = off;
    for _ in 0..4 {
        if off >= cap {
            return None;
        }
        h = shed::step(h, data[data_index(off)]);
        off += 1;
    }
    Some(h)
}
