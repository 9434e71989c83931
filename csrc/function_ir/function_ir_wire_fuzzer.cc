// libFuzzer target: arbitrary bytes as a wire::FunctionIr. Parsing must
// either fail with InvalidArgument or give a function that serializes back
// to the message it came from and parses again to the same function. Built
// with ASan and UBSan by `make fuzz`, so a crash, an out-of-bounds access,
// undefined behaviour or a leak on any input is a finding.

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstdio>
#include <string>

#include "absl/status/status.h"
#include "csrc/function_ir/function_ir_wire.h"
#include "google/protobuf/util/message_differencer.h"

namespace pw {
namespace {

[[noreturn]] void Fail(const char* what, const std::string& detail) {
  std::fprintf(stderr, "function_ir_wire_fuzzer: %s\n%s\n", what, detail.c_str());
  std::abort();
}

void RunOne(const uint8_t* data, size_t size) {
  const absl::string_view bytes(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<std::shared_ptr<const FunctionIr>> ir = ParseFunctionIr(bytes);
  if (!ir.ok()) {
    if (ir.status().code() != absl::StatusCode::kInvalidArgument) {
      Fail("an error that is not InvalidArgument", ir.status().ToString());
    }
    return;
  }
  // Canonical: the function's message is the one received.
  wire::FunctionIr received, rebuilt;
  if (!received.ParseFromArray(data, static_cast<int>(size))) Fail("parsed twice differently", "");
  ToProto(**ir, &rebuilt);
  if (!google::protobuf::util::MessageDifferencer::Equals(received, rebuilt)) {
    Fail("ToProto(ParseFunctionIr(x)) is not x", (*ir)->ToText());
  }
  const std::string again = SerializeFunctionIr(**ir);
  absl::StatusOr<std::shared_ptr<const FunctionIr>> second = ParseFunctionIr(again);
  if (!second.ok()) Fail("a serialized function does not parse", second.status().ToString());
  const FunctionIr& a = **ir;
  const FunctionIr& b = **second;
  if (a.ToText() != b.ToText() || a.simulated_ns() != b.simulated_ns() ||
      a.axis_size() != b.axis_size() || a.axis_name() != b.axis_name() ||
      a.num_params() != b.num_params() || a.num_outputs() != b.num_outputs()) {
    Fail("round trip changed the function", a.ToText() + "\n" + b.ToText());
  }
  for (int i = 0; i < a.num_params(); ++i) {
    if (!(a.param_type(i) == b.param_type(i))) Fail("round trip changed a parameter", a.ToText());
  }
  for (int i = 0; i < a.num_outputs(); ++i) {
    if (!(a.output_type(i) == b.output_type(i))) Fail("round trip changed an output", a.ToText());
  }
}

}  // namespace
}  // namespace pw

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  pw::RunOne(data, size);
  return 0;
}
