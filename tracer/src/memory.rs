//! The process's allocator, and handing memory back to the system.
//!
//! mimalloc: decoding and correlating allocate and free a few dozen small blocks per
//! packet, and glibc's malloc/free spent about a quarter of a run's instructions on them
//! (README, Performance). mimalloc returns freed memory to the system some time after it
//! is freed, on a later allocation; start-up's big, short-lived parses of the kernel's BTF
//! (tens of MiB each) would then add up to a peak of resident memory twice what they need,
//! so [`release_freed`] hands them back at once.

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Returns the memory freed so far to the system now (after start-up's large parses).
pub fn release_freed() {
    // SAFETY: mi_collect only walks mimalloc's own heaps (those of the calling thread and
    // the abandoned ones); it may be called at any time, from any thread.
    unsafe { libmimalloc_sys::mi_collect(true) }
}
