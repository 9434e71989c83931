#include "csrc/object_store/host_memory_pool.h"

namespace pw {

HostMemoryPool& HostMemoryPool::Get() {
  static HostMemoryPool* pool = new HostMemoryPool();  // never destroyed: buffers may outlive main
  return *pool;
}

void* HostMemoryPool::Allocate(size_t bytes) {
  if (bytes >= kMinCachedBytes) {
    MutexLock lock(&mu_);
    auto it = free_.find(bytes);
    if (it != free_.end() && !it->second.empty()) {
      void* p = it->second.back();
      it->second.pop_back();
      cached_bytes_ -= bytes;
      return p;
    }
  }
  return ::operator new(bytes, kAlignment);
}

void HostMemoryPool::Free(void* p, size_t bytes) {
  if (bytes >= kMinCachedBytes) {
    MutexLock lock(&mu_);
    if (cached_bytes_ + bytes <= kMaxCachedBytes) {
      free_[bytes].push_back(p);
      cached_bytes_ += bytes;
      return;
    }
  }
  ::operator delete(p, kAlignment);
}

size_t HostMemoryPool::cached_bytes() const {
  MutexLock lock(&mu_);
  return cached_bytes_;
}

void HostMemoryPool::Trim() {
  absl::flat_hash_map<size_t, std::vector<void*>> blocks;
  {
    MutexLock lock(&mu_);
    blocks.swap(free_);
    cached_bytes_ = 0;
  }
  for (auto& [bytes, list] : blocks) {
    for (void* p : list) ::operator delete(p, kAlignment);
  }
}

}  // namespace pw
