#ifndef PATHWAYS_BINDINGS_SHARDED_BUFFER_H_
#define PATHWAYS_BINDINGS_SHARDED_BUFFER_H_

// The Python-facing ShardedBuffer: a handle on one logical buffer. delete()
// drops this handle's reference (device memory returns once running
// computations that still read the buffer are done); any later use raises
// DeletedBufferError.
//
// Suspend and resume (pw.Client.suspend/resume): a client's handles are
// swapped, under the GIL, from their device buffers to host copies
// (SuspendedValue) and back onto devices, maybe other ones. A reader that
// took its own reference (PyShardedBuffer::Get) before the swap keeps
// reading the device buffer it took.

#include <cstdint>
#include <memory>

#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "csrc/object_store/sharded_buffer.h"
#include "csrc/scheduler/gang_scheduler.h"
#include "pybind11/numpy.h"
#include "pybind11/pybind11.h"

namespace pw::bindings {

// A buffer's value while its client is suspended: every shard, in host
// memory, or in the checkpoint the client was suspended to. Shared by the
// handles that shared the buffer; immutable.
struct SuspendedValue {
  DType dtype = DType::kF32;
  Dims dims;                          // the buffer's, device axis included
  const DeviceList* devices = nullptr;  // where it was
  std::string client;                 // its client's name, for messages
  int index = 0;                      // its number in the suspension ("b<index>" in a checkpoint)
  int64_t total_bytes = 0;
  // Every shard, shard-major; null when the value is in a checkpoint.
  std::unique_ptr<char[]> bytes;
};

struct PyShardedBuffer {
  std::shared_ptr<ShardedBuffer> buffer;  // null once deleted, or while suspended
  // Set while its client is suspended (buffer is null then).
  std::shared_ptr<const SuspendedValue> suspended;
  // A replicated handle stands for one value held whole by every device of
  // its buffer (pmap's out_axes=None, pw.jit): its value is shard 0, and
  // `dims` are the buffer's without the leading (device) axis. Otherwise the
  // value is the whole buffer, leading axis included.
  bool replicated = false;
  // Kept after delete() so the handle can still say what it was: the dims
  // of the value (see `replicated`).
  DType dtype = DType::kF32;
  Dims dims;
  // Why it was deleted when not by delete() (its client closed), for errors.
  std::string deleted_why;

  explicit PyShardedBuffer(std::shared_ptr<ShardedBuffer> b, bool is_replicated = false)
      : buffer(std::move(b)), replicated(is_replicated), dtype(buffer->dtype()), dims(buffer->dims()) {
    if (replicated) dims.erase(dims.begin());
  }

  // The buffer, or DeletedBufferError naming what was deleted and `use`
  // (RuntimeError while its client is suspended). A reference of the
  // caller's own: another thread may delete() or suspend this handle while
  // the caller waits without the GIL.
  std::shared_ptr<ShardedBuffer> Get(const char* use) const;
  bool is_deleted() const { return buffer == nullptr && suspended == nullptr; }
  // "" when deleted by delete(), else " (why)", for messages.
  std::string DeletedWhy() const { return deleted_why.empty() ? "" : " (" + deleted_why + ")"; }
};

// Handles of the buffers a client owns (outputs of its programs and its
// device_puts), so that closing the client can delete them. With the GIL.
void RegisterClientHandle(const SchedulingClient* client, const std::shared_ptr<PyShardedBuffer>& handle);
// Deletes every live handle `client` owns (as delete() does, saying why),
// suspended ones too (their host copies go); returns how many. With the GIL.
int DeleteClientHandles(const SchedulingClient* client);

// A dispatch (program run or device_put) for `client` (null: none), from
// its check to the registration of its outputs, all with the GIL (the
// dispatch itself may release it). RuntimeError, naming the client and what
// it does (`what` + `name`, joined only then: this is the dispatch path), if
// the client is suspended: it must be resumed first. Suspending waits for
// the dispatches under way.
class ClientDispatch {
 public:
  ClientDispatch(const SchedulingClient* client, absl::string_view what, absl::string_view name = "");
  ~ClientDispatch();
  ClientDispatch(const ClientDispatch&) = delete;
  ClientDispatch& operator=(const ClientDispatch&) = delete;

 private:
  const SchedulingClient* client_;
};

// pw.Client.suspend (with the GIL): waits for the client's dispatches under
// way and its live buffers; copies each buffer its handles hold (once,
// however many handles share it) to host memory, or, with `save`, calls
// save(list of handles, one per buffer, not replicated) to write them
// elsewhere (a checkpoint) and keeps no copy; then swaps the handles to
// the copies and drops their device buffers. Buffers that failed (their
// producer, or their devices) stay as they are. RuntimeError if the client
// is closed or suspended already; any error (save's too) leaves it as it
// was. Returns {"buffers", "bytes", "failed_buffers"}.
pybind11::dict SuspendClientHandles(SchedulingClient* client, const pybind11::object& save);

// pw.Client.resume (with the GIL): puts every suspended value that a live
// handle still holds back on its devices when they are healthy, usable and
// have room now, else on other devices of the same island, else of
// another (healthy, with room, least used first), and swaps the handles
// back. Never waits for memory. `loaded` (for a client suspended with
// `save`): a dict "b<index>" -> numpy array of the value. All or nothing:
// ResourceExhaustedError when a value fits nowhere, after which the client
// is still suspended with every value. RuntimeError if the client is closed
// or not suspended. Returns {"buffers", "bytes", "moved": [{"buffer",
// "shape", "dtype", "from", "to"}]}.
pybind11::dict ResumeClientHandles(SchedulingClient* client, const pybind11::object& loaded);

// Whether `client` is suspended (or being suspended or resumed).
bool IsClientSuspended(const SchedulingClient* client);

// Waits until `buffer` is done (ready or failed) with the GIL released,
// interruptibly (waiting.h). RuntimeError in a forked child (base/fork.h),
// where a pending buffer would never complete.
void AwaitDone(const ShardedBuffer& buffer);

// Waits for `buffer` with the GIL released, interruptibly (waiting.h);
// raises the producer's error, or DeviceFailedError if one of its devices
// failed. RuntimeError in a forked child (base/fork.h), where a pending
// buffer would never complete.
void AwaitOrThrow(const ShardedBuffer& buffer);

// The physical devices of `devices` (Devices, or VirtualDevices' physical
// ones); TypeError for anything else.
std::vector<Device*> ToPhysical(const pybind11::sequence& devices);

// numpy dtype for `dtype`, and back (TypeError for other dtypes).
pybind11::dtype NumpyDType(DType dtype);
DType FromNumpyDType(const pybind11::dtype& dtype, const char* what);

}  // namespace pw::bindings

#endif  // PATHWAYS_BINDINGS_SHARDED_BUFFER_H_
