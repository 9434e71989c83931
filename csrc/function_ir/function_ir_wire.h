#ifndef PATHWAYS_FUNCTION_IR_FUNCTION_IR_WIRE_H_
#define PATHWAYS_FUNCTION_IR_FUNCTION_IR_WIRE_H_

// The wire form of a FunctionIr (function_ir.proto), as the client sends a
// traced function to the host processes that compile and run it.
//
// Encoding writes, per op, the arguments of the FunctionBuilder call that
// makes it. Decoding replays those calls on a fresh FunctionBuilder, op by op,
// so a function from the network passes every check a traced one does, and
// then requires each call to give back exactly the op that was sent: one new
// op (no conversion inserted, no identity elided), with the same attributes.
// A host therefore never sees an IR the builder could not have made, and
// ParseFunctionIr(SerializeFunctionIr(ir)) is `ir` again (same text, types,
// simulated time, axis name and size).
//
// Decoding takes arbitrary bytes: every malformed input is InvalidArgument,
// prefixed "function wire:" and naming the op and field at fault. It never
// crashes and allocates in proportion to its input (sizes are checked before
// anything is allocated). All functions are thread-safe (no shared state).

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "csrc/function_ir/function_ir.h"
#include "csrc/function_ir/function_ir.pb.h"

namespace pw {

// The largest rank of a value a decoded function may have (numpy's limit):
// it bounds the memory a small message can make the builder allocate, since
// every op copies its operand's dims.
inline constexpr int kMaxWireRank = 64;

// The largest axis size a decoded function may declare: the most devices a
// slice has (cluster.h's kMaxDevices). Ppermute allocates per shard.
inline constexpr int64_t kMaxWireAxisSize = kMaxAxisSize;

// Writes `ir` into `out` (cleared first).
void ToProto(const FunctionIr& ir, wire::FunctionIr* out);

// `ir` as a serialized wire::FunctionIr. Protobuf cannot serialize a message
// over 2 GiB (constants that large): the result is then empty, which does not
// parse.
std::string SerializeFunctionIr(const FunctionIr& ir);

// Rebuilds the function `proto` describes through FunctionBuilder.
// InvalidArgument for a malformed message (see above), including ranks above
// kMaxWireRank, axis sizes above kMaxWireAxisSize and fields this build does
// not know (an older host must not drop an attribute it cannot read and
// compute something else).
absl::StatusOr<std::shared_ptr<const FunctionIr>> FromProto(const wire::FunctionIr& proto);

// Parses `bytes` (a serialized wire::FunctionIr) and rebuilds the function as
// FromProto does. InvalidArgument also for bytes that are not such a message.
absl::StatusOr<std::shared_ptr<const FunctionIr>> ParseFunctionIr(absl::string_view bytes);

}  // namespace pw

#endif  // PATHWAYS_FUNCTION_IR_FUNCTION_IR_WIRE_H_
