#ifndef PATHWAYS_BASE_MUTEX_H_
#define PATHWAYS_BASE_MUTEX_H_

// A mutex annotated for clang's thread-safety analysis (ABSL_GUARDED_BY and
// friends work with it), built on std::mutex.
//
// Why not absl::Mutex: Debian's libabsl is not built with ThreadSanitizer, so
// TSan cannot see absl::Mutex's happens-before edges and reports false races
// on every guarded field. std::mutex goes through pthread, which TSan
// intercepts, so `make sanitize` sees the real synchronization.

#include <chrono>
#include <condition_variable>
#include <mutex>

#include "absl/base/thread_annotations.h"

namespace pw {

class ABSL_LOCKABLE Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void Lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() { mu_.lock(); }
  void Unlock() ABSL_UNLOCK_FUNCTION() { mu_.unlock(); }
  bool TryLock() ABSL_EXCLUSIVE_TRYLOCK_FUNCTION(true) { return mu_.try_lock(); }
  void AssertHeld() const ABSL_ASSERT_EXCLUSIVE_LOCK() {}

 private:
  friend class CondVar;
  std::mutex mu_;
};

// Scoped lock of a pw::Mutex.
class ABSL_SCOPED_LOCKABLE MutexLock {
 public:
  explicit MutexLock(Mutex* mu) ABSL_EXCLUSIVE_LOCK_FUNCTION(mu) : mu_(mu) { mu_->Lock(); }
  ~MutexLock() ABSL_UNLOCK_FUNCTION() { mu_->Unlock(); }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

 private:
  Mutex* mu_;
};

// Condition variable for a pw::Mutex. Wait() must be called with the mutex held.
class CondVar {
 public:
  void Wait(Mutex* mu) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    std::unique_lock<std::mutex> lock(mu->mu_, std::adopt_lock);
    cv_.wait(lock);
    lock.release();
  }
  // Waits until signaled or `deadline`; returns false on timeout.
  bool WaitUntil(Mutex* mu, std::chrono::steady_clock::time_point deadline) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    std::unique_lock<std::mutex> lock(mu->mu_, std::adopt_lock);
    const bool signaled = cv_.wait_until(lock, deadline) == std::cv_status::no_timeout;
    lock.release();
    return signaled;
  }
  void Signal() { cv_.notify_one(); }
  void SignalAll() { cv_.notify_all(); }

 private:
  std::condition_variable cv_;
};

}  // namespace pw

#endif  // PATHWAYS_BASE_MUTEX_H_
