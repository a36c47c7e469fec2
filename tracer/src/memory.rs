//! The process's allocator, and handing memory back to the system.
//!
//! mimalloc: decoding and correlating allocate and free a few dozen small blocks per
//! packet, and glibc's malloc/free spent about a quarter of a run's instructions on them
//! (README, Performance). mimalloc returns freed memory to the system some time after it
//! is freed, on a later allocation; start-up's big, short-lived parses of the kernel's BTF
//! (tens of MiB each) would then add up to a peak of resident memory twice what they need,
//! so [`release_freed`] hands them back at once.

#[cfg(not(feature = "system-allocator"))]
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Returns the memory freed so far to the system now (after start-up's large parses).
#[cfg(not(feature = "system-allocator"))]
pub fn release_freed() {
    // SAFETY: mi_collect only walks mimalloc's own heaps (those of the calling thread and
    // the abandoned ones); it may be called at any time, from any thread.
    unsafe { libmimalloc_sys::mi_collect(true) }
}

/// The system allocator's (`system-allocator`, for heap profilers): glibc's `malloc_trim`.
#[cfg(feature = "system-allocator")]
pub fn release_freed() {
    // SAFETY: malloc_trim only returns glibc's free memory to the system.
    unsafe { libc::malloc_trim(0) };
}

/// Runs `f`, and returns what it made with how many more bytes the allocator's blocks hold
/// after it than before (whole blocks, as allocated; the process's, so other threads'
/// allocations meanwhile count too): how tests check that a structure's own count of its
/// size covers what it really takes. `None` with the system allocator.
pub fn heap_bytes_of<T>(f: impl FnOnce() -> T) -> (T, Option<usize>) {
    #[cfg(not(feature = "system-allocator"))]
    {
        use libmimalloc_sys::{mi_heap_area_t, mi_heap_t, mi_heap_visit_blocks};
        use std::ffi::c_void;
        // mimalloc 3's process-wide heap (mimalloc.h), not in libmimalloc-sys.
        unsafe extern "C" {
            fn mi_heap_main() -> *mut mi_heap_t;
        }
        unsafe extern "C" fn area(
            _heap: *const mi_heap_t,
            area: *const mi_heap_area_t,
            _block: *mut c_void,
            _size: usize,
            arg: *mut c_void,
        ) -> bool {
            // SAFETY: mimalloc passes a valid area; `arg` is the `usize` below, borrowed
            // for the walk.
            unsafe {
                if let (Some(a), Some(sum)) = (area.as_ref(), arg.cast::<usize>().as_mut()) {
                    *sum += a.used * a.full_block_size;
                }
            }
            true
        }
        let used = || {
            let mut sum = 0usize;
            // SAFETY: a walk over the main heap's areas, reading their counts.
            unsafe {
                mi_heap_visit_blocks(mi_heap_main(), false, Some(area), (&raw mut sum).cast())
            };
            sum
        };
        // One measure at a time: each other's structures are not noise for the other.
        static ONE: std::sync::Mutex<()> = std::sync::Mutex::new(());
        let _one = ONE
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let before = used();
        let made = f();
        let after = used();
        (made, Some(after.saturating_sub(before)))
    }
    #[cfg(feature = "system-allocator")]
    (f(), None)
}
