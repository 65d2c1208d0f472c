// The weights a decoding step streams, moved onto 2 MiB pages (Linux transparent huge pages).
//
// Why: a decoded token reads every weight once, hundreds of MB in address order. On 4 KiB pages that
// is a TLB miss every 4 KiB, and the hardware prefetchers stop at each 4 KiB boundary; on 2 MiB pages
// both go 512× further. PyTorch's allocator hands out 4 KiB pages (THP is "madvise" on most
// distributions, and a layer's matrices are heap blocks below 2 MiB). MADV_COLLAPSE (Linux 6.1)
// copies the 2 MiB-aligned regions holding a tensor into huge pages in place: same addresses, same
// contents; the regions' other bytes (neighbouring heap blocks) come along unchanged. Where the kernel
// cannot (older kernels, file-backed or special mappings, no free huge page) the call fails and the
// pages stay as they were: speed only, never a result.
// Measured on an AMD EPYC Zen 3 (bench/huge_pages.py; nn/cpu_tuning.py gives the figures): the fp32
// and Q8_0 SmolLM2-135M steps ~1.06x faster, Q4_0 about even; the first plan build pays the copy and
// the kernel's compaction once (0.3-1.9 s for that model), later builds find the pages already huge.
// Source: madvise(2), MADV_COLLAPSE; Documentation/admin-guide/mm/transhuge.rst.
#pragma once

#include <cstdint>
#include <set>
#ifdef __linux__
#include <sys/mman.h>
#endif

namespace attnlab_decode {

constexpr uintptr_t kHugePage = uintptr_t(1) << 21;

// Collapse the 2 MiB regions overlapping bytes [p, p + n) that `done` does not hold yet; adds the ones
// now on a huge page to `done` (a region's start address).
inline void collapse_huge_pages(const void* p, int64_t n, std::set<uintptr_t>& done) {
#if defined(__linux__)
#ifndef MADV_COLLAPSE
  constexpr int MADV_COLLAPSE = 25;  // <sys/mman.h> of an older libc; the kernel decides
#endif
  if (n <= 0) return;
  const uintptr_t lo = (uintptr_t)p & ~(kHugePage - 1), hi = ((uintptr_t)p + (uintptr_t)n + kHugePage - 1) & ~(kHugePage - 1);
  for (uintptr_t a = lo; a < hi; a += kHugePage)
    if (!done.count(a) && madvise((void*)a, kHugePage, MADV_COLLAPSE) == 0) done.insert(a);
#else
  (void)p, (void)n, (void)done;
#endif
}

}  // namespace attnlab_decode
