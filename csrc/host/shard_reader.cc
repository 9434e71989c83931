#include "csrc/host/shard_reader.h"

#include <utility>

#include "csrc/base/mutex.h"

namespace pw {
namespace {

Mutex reader_mu;
ShardReader* reader ABSL_GUARDED_BY(reader_mu) = nullptr;

}  // namespace

void SetShardReader(ShardReader r) {
  MutexLock lock(&reader_mu);
  delete reader;
  reader = r ? new ShardReader(std::move(r)) : nullptr;
}

ShardReader GetShardReader() {
  MutexLock lock(&reader_mu);
  return reader != nullptr ? *reader : ShardReader();
}

}  // namespace pw
