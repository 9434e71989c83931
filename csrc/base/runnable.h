#ifndef PATHWAYS_BASE_RUNNABLE_H_
#define PATHWAYS_BASE_RUNNABLE_H_

// A unit of work that an executor thread runs, and the intrusive list in
// which work that just became ready is collected. The list needs no
// allocation, so making a node ready on the dispatch path costs a pointer
// write; whoever collected the list hands it to the WorkerPool in one go.

#include <cstdint>
#include <exception>
#include <vector>

namespace pw {

struct ReadyList;

// Per-thread state an executor passes to every Runnable it runs.
struct RunContext {
  // Work made ready while running; the executor runs it next (the first item
  // inline on the same thread, so a chain of nodes needs no wake-up).
  ReadyList* ready = nullptr;
  // Grows as needed; reused across runs on the same thread.
  std::vector<uint8_t, std::allocator<uint8_t>>* scratch = nullptr;

  // 64-byte aligned scratch of at least `bytes`; null if it cannot be
  // allocated (the caller fails its work: an executor thread must not throw).
  void* Scratch(int64_t bytes) {
    const size_t need = static_cast<size_t>(bytes) + 64;
    if (scratch->size() < need) {
      try {
        scratch->resize(need);
      } catch (const std::exception&) {  // bad_alloc, length_error
        return nullptr;
      }
    }
    const uintptr_t p = reinterpret_cast<uintptr_t>(scratch->data());
    return reinterpret_cast<void*>((p + 63) & ~uintptr_t{63});
  }
};

class Runnable {
 public:
  virtual ~Runnable() = default;
  // Runs the work. Called once per submission, on an executor thread (most
  // runnables are submitted once; ParallelTeam's helpers again and again). May delete
  // `this`. Must not block and must not call into Python.
  virtual void Run(RunContext& ctx) = 0;

 private:
  friend struct ReadyList;
  Runnable* next_ready_ = nullptr;
};

// FIFO of runnables linked through Runnable::next_ready_. Not thread-safe:
// owned by one thread at a time.
struct ReadyList {
  Runnable* head = nullptr;
  Runnable* tail = nullptr;

  bool empty() const { return head == nullptr; }
  void Push(Runnable* r) {
    r->next_ready_ = nullptr;
    if (tail) {
      tail->next_ready_ = r;
    } else {
      head = r;
    }
    tail = r;
  }
  Runnable* Pop() {
    Runnable* r = head;
    if (r) {
      head = r->next_ready_;
      if (!head) tail = nullptr;
      r->next_ready_ = nullptr;
    }
    return r;
  }
  // Moves all of `other` to the back of this list.
  void Splice(ReadyList& other) {
    if (other.empty()) return;
    if (tail) {
      tail->next_ready_ = other.head;
    } else {
      head = other.head;
    }
    tail = other.tail;
    other.head = other.tail = nullptr;
  }
};

}  // namespace pw

#endif  // PATHWAYS_BASE_RUNNABLE_H_
