#ifndef PATHWAYS_HOST_SHARD_READER_H_
#define PATHWAYS_HOST_SHARD_READER_H_

// A host process's checkpoint reader (wire::LoadShards; pw.checkpointing):
// reads the host's shards of new buffers from a checkpoint, straight into
// the buffers' memory. The sibling of the writer (shard_writer.h), set by
// the process that runs the host: `python -m pathways.host` sets one that
// reads with tensorstore (python/pathways/_checkpoint_io.py). A host without
// one refuses LoadShards (Unimplemented).

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace pw {

// One buffer's shards on this host: the client's spec (JSON), the positions
// of this host's shards in the buffer's device list (increasing: the host's
// own, from the list it knows), and where they go: `bytes` bytes at `data`,
// shard after shard in that order. The memory is the buffer's; it is valid
// and this reader's alone until the reader returns, and no longer.
struct ShardsToRead {
  std::string spec_json;
  std::vector<int> positions;
  uint8_t* data = nullptr;
  int64_t bytes = 0;
};

// Reads `shards` from the checkpoint in directory `database`; called on the
// host's storage thread (it may take seconds), never two at once per host.
// An error fails every buffer of the call (its message names what failed).
using ShardReader = std::function<absl::Status(const std::string& database, std::vector<ShardsToRead> shards)>;

// Sets the process's reader (empty: none). Thread-safe.
void SetShardReader(ShardReader reader);
// The process's reader (empty if none).
ShardReader GetShardReader();

}  // namespace pw

#endif  // PATHWAYS_HOST_SHARD_READER_H_
