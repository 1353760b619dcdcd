#include "backend/cpu/cpu_paged_store.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <new>
#include <string>
#include <utility>
#include <vector>

#include "common/error.h"

namespace ppb::cpu {

size_t page_bytes() {
  static const size_t page = [] {
    const long p = sysconf(_SC_PAGESIZE);
    return p > 0 ? static_cast<size_t>(p) : size_t{4096};
  }();
  return page;
}

PagedStore::PagedStore(size_t floats) : bytes_(floats * sizeof(float)) {
  if (bytes_ == 0) return;
  void* p = mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) throw std::bad_alloc();
  // A transparent huge page would make 2 MiB the unit of residency (one write commits it all).
#ifdef MADV_NOHUGEPAGE
  madvise(p, bytes_, MADV_NOHUGEPAGE);
#endif
  data_ = static_cast<float*>(p);
}

PagedStore::~PagedStore() {
  if (data_ != nullptr) munmap(data_, bytes_);
}

PagedStore::PagedStore(PagedStore&& o) noexcept : data_(std::exchange(o.data_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}

PagedStore& PagedStore::operator=(PagedStore&& o) noexcept {
  if (this != &o) {
    if (data_ != nullptr) munmap(data_, bytes_);
    data_ = std::exchange(o.data_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
  }
  return *this;
}

void PagedStore::release(const float* p, size_t floats) {
  const auto base = reinterpret_cast<uintptr_t>(data_), begin = reinterpret_cast<uintptr_t>(p);
  const uintptr_t end = begin + floats * sizeof(float);
  if (begin < base || end > base + bytes_)
    throw InternalError("paged KV store: a release outside the store");
  const uintptr_t page = page_bytes();
  const uintptr_t first = (begin + page - 1) / page * page, last = end / page * page;
  if (last <= first) return;
  if (madvise(reinterpret_cast<void*>(first), last - first, MADV_DONTNEED) != 0)
    throw InternalError("paged KV store: madvise(MADV_DONTNEED) failed");
}

size_t PagedStore::resident_bytes() const {
  if (data_ == nullptr) return 0;
  const size_t page = page_bytes(), pages = (bytes_ + page - 1) / page;
  std::vector<unsigned char> in(pages);
  if (mincore(data_, bytes_, in.data()) != 0) throw InternalError("paged KV store: mincore failed");
  size_t n = 0;
  for (unsigned char c : in) n += c & 1;
  return n * page;
}

}  // namespace ppb::cpu
