#include "csrc/host/shard_writer.h"

#include <utility>

#include "csrc/base/mutex.h"

namespace pw {
namespace {

Mutex writer_mu;
ShardWriter* writer ABSL_GUARDED_BY(writer_mu) = nullptr;

}  // namespace

void SetShardWriter(ShardWriter w) {
  MutexLock lock(&writer_mu);
  delete writer;
  writer = w ? new ShardWriter(std::move(w)) : nullptr;
}

ShardWriter GetShardWriter() {
  MutexLock lock(&writer_mu);
  return writer != nullptr ? *writer : ShardWriter();
}

}  // namespace pw
