//! Byte search for the template code: the one place `{{`/`}}` and single bytes are
//! found, shared by the compiler, the engine and the scanner (which depend on each other in
//! one direction only: scan → engine → compile → bytes).

/// Position of the first doubled byte (`{{` or `}}`). [`find_byte`] for the byte, then
/// a look at the next: `str::find` with a two-byte pattern builds a searcher per call,
/// which dominated `check`, and a byte-at-a-time loop dominated loading a loop's prompts.
pub(super) fn find2(s: &str, b: u8) -> Option<usize> {
    let bytes = s.as_bytes();
    let mut from = 0;
    while let Some(p) = find_byte(&s[from..], b) {
        let at = from + p;
        if bytes.get(at + 1) == Some(&b) {
            return Some(at);
        }
        from = at + 1;
    }
    None
}

/// Position of the byte `b` in `s`. On x86-64, the `memchr` crate's SSE2 searcher (SSE2
/// is part of the architecture): its default entry point picks AVX2 after asking the CPU's
/// features on first use, and on a virtual machine each of std's ~8 `cpuid`s is a VM exit
/// (5 µs each on the development VM: ~40 µs per process, more than all of a tick's
/// template scans; core's word-at-a-time search, the other way around it, costs 8% more
/// instructions in `report`).
pub(super) fn find_byte(s: &str, b: u8) -> Option<usize> {
    #[cfg(all(target_arch = "x86_64", target_feature = "sse2"))]
    if let Some(one) = memchr::arch::x86_64::sse2::memchr::One::new(b) {
        return one.find(s.as_bytes());
    }
    memchr::memchr(b, s.as_bytes())
}
