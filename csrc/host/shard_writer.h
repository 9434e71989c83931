#ifndef PATHWAYS_HOST_SHARD_WRITER_H_
#define PATHWAYS_HOST_SHARD_WRITER_H_

// A host process's checkpoint writer (wire::SaveShards; pw.checkpointing):
// writes the host's shards of buffers into one writer's database of a
// checkpoint. The process that runs the host sets it: `python -m
// pathways.host` sets one that writes with tensorstore, in Orbax's format
// (python/pathways/_checkpoint_io.py). A host without one refuses
// SaveShards (Unimplemented).

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace pw {

// One buffer's shards on this host: the client's spec (JSON) and the bytes
// of the host's shards, in the order of their devices in the buffer's list:
// the host buffer's memory itself, held (it does not change once the buffer
// is done).
struct ShardsToWrite {
  std::string spec_json;
  std::shared_ptr<const void> data;
  int64_t bytes = 0;
};

// Writes `shards` into the database in directory `database`; called on a
// thread of its own (it may take seconds), never two at once per host.
using ShardWriter = std::function<absl::Status(const std::string& database, std::vector<ShardsToWrite> shards)>;

// Sets the process's writer (empty: none). Thread-safe.
void SetShardWriter(ShardWriter writer);
// The process's writer (empty if none).
ShardWriter GetShardWriter();

}  // namespace pw

#endif  // PATHWAYS_HOST_SHARD_WRITER_H_
