#ifndef PATHWAYS_BINDINGS_SHARDED_BUFFER_H_
#define PATHWAYS_BINDINGS_SHARDED_BUFFER_H_

// The Python-facing ShardedBuffer: a handle on one logical buffer. delete()
// drops this handle's reference (device memory returns once running
// computations that still read the buffer are done); any later use raises
// DeletedBufferError.

#include <memory>

#include <string>
#include <vector>

#include "csrc/object_store/sharded_buffer.h"
#include "csrc/scheduler/gang_scheduler.h"
#include "pybind11/numpy.h"
#include "pybind11/pybind11.h"

namespace pw::bindings {

struct PyShardedBuffer {
  std::shared_ptr<ShardedBuffer> buffer;  // null once deleted
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

  // The buffer, or DeletedBufferError naming what was deleted and `use`.
  // A reference of the caller's own: another thread may delete() this
  // handle while the caller waits without the GIL.
  std::shared_ptr<ShardedBuffer> Get(const char* use) const;
  // "" when deleted by delete(), else " (why)", for messages.
  std::string DeletedWhy() const { return deleted_why.empty() ? "" : " (" + deleted_why + ")"; }
};

// Handles of the buffers a client owns (outputs of its programs and its
// device_puts), so that closing the client can delete them. With the GIL.
void RegisterClientHandle(const SchedulingClient* client, const std::shared_ptr<PyShardedBuffer>& handle);
// Deletes every live handle `client` owns (as delete() does, saying why);
// returns how many. With the GIL.
int DeleteClientHandles(const SchedulingClient* client);

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
