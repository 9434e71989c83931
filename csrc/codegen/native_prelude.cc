#include "csrc/codegen/fused_region.h"

namespace pw::codegen {

const char* NativePrelude() {
  static const char* const kPrelude =
#include "native_prelude.inc"
      ;
  return kPrelude;
}

}  // namespace pw::codegen
