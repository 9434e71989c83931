#include "csrc/base/background_thread.h"

namespace pw {
namespace {
thread_local bool tls_background = false;
}  // namespace

void MarkBackgroundThread() { tls_background = true; }

bool IsBackgroundThread() { return tls_background; }

}  // namespace pw
