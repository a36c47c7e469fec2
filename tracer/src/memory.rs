//! The process's allocator, and handing memory back to the system.
//!
//! mimalloc: decoding and correlating allocate and free a few dozen small blocks per
//! packet, and glibc's malloc/free spent about a quarter of a run's instructions on them
//! (docs/performance.md). mimalloc returns freed memory to the system some time after it
//! is freed, on a later allocation; start-up's big, short-lived parses of the kernel's BTF
//! (tens of MiB each) would then add up to a peak of resident memory twice what they need,
//! so [`release_freed`] hands them back at once.

#[cfg(all(not(test), not(feature = "system-allocator")))]
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// In the unit tests, mimalloc counting each thread's blocks (see [`heap_bytes_of`]).
#[cfg(all(test, not(feature = "system-allocator")))]
#[global_allocator]
static GLOBAL: counting::Counting = counting::Counting;

#[cfg(all(test, not(feature = "system-allocator")))]
mod counting {
    use std::{
        alloc::{GlobalAlloc, Layout},
        cell::Cell,
    };

    thread_local! {
        /// Bytes of the blocks this thread allocated less those it freed.
        pub(super) static HELD: Cell<isize> = const { Cell::new(0) };
    }

    fn count(p: *mut u8, sign: isize) {
        if p.is_null() {
            return;
        }
        // SAFETY: `p` is a live block of mimalloc's.
        let n = unsafe { libmimalloc_sys::mi_usable_size(p.cast()) } as isize;
        let _ = HELD.try_with(|h| h.set(h.get() + sign * n));
    }

    pub(super) struct Counting;

    // SAFETY: mimalloc's, with a count beside.
    unsafe impl GlobalAlloc for Counting {
        unsafe fn alloc(&self, l: Layout) -> *mut u8 {
            // SAFETY: as GlobalAlloc::alloc.
            let p = unsafe { mimalloc::MiMalloc.alloc(l) };
            count(p, 1);
            p
        }
        unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
            // SAFETY: as GlobalAlloc::alloc_zeroed.
            let p = unsafe { mimalloc::MiMalloc.alloc_zeroed(l) };
            count(p, 1);
            p
        }
        unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
            count(p, -1);
            // SAFETY: as GlobalAlloc::dealloc.
            unsafe { mimalloc::MiMalloc.dealloc(p, l) }
        }
        unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
            count(p, -1);
            // SAFETY: as GlobalAlloc::realloc.
            let q = unsafe { mimalloc::MiMalloc.realloc(p, l, new) };
            count(if q.is_null() { p } else { q }, 1);
            q
        }
    }
}

/// Returns the memory freed so far to the system now (after start-up's large parses).
#[cfg(not(feature = "system-allocator"))]
pub(crate) fn release_freed() {
    // SAFETY: mi_collect only walks mimalloc's own heaps (those of the calling thread and
    // the abandoned ones); it may be called at any time, from any thread.
    unsafe { libmimalloc_sys::mi_collect(true) }
}

/// mimalloc's `purge_delay` option (`mi_option_purge_delay` in mimalloc.h's `mi_option_e`).
#[cfg(not(feature = "system-allocator"))]
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;
/// Its default, ms.
#[cfg(not(feature = "system-allocator"))]
const PURGE_DELAY_MS: std::ffi::c_long = 10;

/// While `on`, memory freed goes back to the system at once; off, mimalloc's default: 10 ms
/// later (100 ms for its arenas), when a later allocation gets round to it. Start-up frees
/// tens of MiB (the kernel's BTF, parsed twice; the eBPF object; kallsyms), and an idle
/// agent makes no later allocations: it kept ~20 MiB of them resident (RssAnon 45.8 MiB idle
/// on an empty node, 26.7 with the purge at once). Off again once started: under load,
/// purging every freed page at once would cost a system call and a page fault per reuse.
#[cfg(not(feature = "system-allocator"))]
pub(crate) fn purge_at_once(on: bool) {
    let delay = if on { 0 } else { PURGE_DELAY_MS };
    // SAFETY: sets one of mimalloc's options; allowed at any time, from any thread.
    unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, delay) }
}

/// The system allocator's: nothing to set.
#[cfg(feature = "system-allocator")]
pub(crate) fn purge_at_once(_on: bool) {}

/// No transparent huge pages for this process from now on (`PR_SET_THP_DISABLE`, Linux
/// ≥ 3.15; checked at each page fault, so it covers what was mapped before). mimalloc asks
/// for them on its arenas (`MADV_HUGEPAGE`), and a huge page is resident, and charged to the
/// pod's cgroup, whole: 12 of an idle agent's 28 MiB of heap were huge pages mostly unused
/// (`AnonHugePages` in smaps, 110 pod namespaces). A failure (a kernel without THP) changes
/// nothing and is not an error.
pub(crate) fn no_huge_pages() {
    // SAFETY: prctl with an integer option and integer arguments; no memory is passed.
    let r = unsafe { libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0) };
    if r != 0 {
        log::debug!(
            "PR_SET_THP_DISABLE: {}; huge pages stay possible",
            std::io::Error::last_os_error()
        );
    }
}

/// The system allocator's (`system-allocator`, for heap profilers): glibc's `malloc_trim`.
#[cfg(feature = "system-allocator")]
pub fn release_freed() {
    // SAFETY: malloc_trim only returns glibc's free memory to the system.
    unsafe { libc::malloc_trim(0) };
}

/// Runs `f`, and returns what it made with the bytes of the blocks the calling thread
/// allocated in it and did not free (whole blocks, as mimalloc sized them): how tests check
/// that a structure's own count of its size covers what it really takes. `None` with the
/// system allocator.
#[cfg(test)]
pub(crate) fn heap_bytes_of<T>(f: impl FnOnce() -> T) -> (T, Option<usize>) {
    #[cfg(not(feature = "system-allocator"))]
    {
        let held = || counting::HELD.with(std::cell::Cell::get);
        let before = held();
        let made = f();
        let after = held();
        (made, Some(usize::try_from(after - before).unwrap_or(0)))
    }
    #[cfg(feature = "system-allocator")]
    (f(), None)
}
