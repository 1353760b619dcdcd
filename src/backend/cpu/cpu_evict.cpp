#include "backend/cpu/cpu_evict.h"

#include <cstdint>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace ppb::cpu {

namespace {

constexpr size_t kLine = 64;  // the x86 cache line; a smaller one would only flush some lines twice

#if defined(__x86_64__) || defined(__i386__)
__attribute__((target("clflushopt"))) void evict_opt(const char* p, const char* end) {
  for (; p < end; p += kLine) _mm_clflushopt(const_cast<char*>(p));
  _mm_sfence();
}

void evict_plain(const char* p, const char* end) {
  for (; p < end; p += kLine) _mm_clflush(p);
  _mm_mfence();
}

bool have_clflushopt() {
  static const bool have = __builtin_cpu_supports("clflushopt");
  return have;
}
#endif

}  // namespace

bool can_evict_lines() {
#if defined(__x86_64__) || defined(__i386__)
  return true;
#else
  return false;
#endif
}

void evict_lines(const void* p, size_t bytes) {
#if defined(__x86_64__) || defined(__i386__)
  if (bytes == 0) return;
  const auto first = reinterpret_cast<uintptr_t>(p) & ~(uintptr_t{kLine} - 1);
  const char* begin = reinterpret_cast<const char*>(first);
  const char* end = static_cast<const char*>(p) + bytes;
  if (have_clflushopt())
    evict_opt(begin, end);
  else
    evict_plain(begin, end);
#else
  (void)p;
  (void)bytes;
#endif
}

}  // namespace ppb::cpu
