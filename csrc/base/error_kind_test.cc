#include "csrc/base/error_kind.h"

#include "absl/status/statusor.h"
#include "csrc/base/dtype.h"
#include "csrc/base/status_macros.h"
#include "gtest/gtest.h"

namespace pw {
namespace {

TEST(ErrorKindTest, KindsAreInvalidArgumentsWithTheirMessage) {
  const absl::Status type = UnsupportedTypeError("dtype float16 is not supported");
  EXPECT_EQ(type.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(type.message(), "dtype float16 is not supported");
  EXPECT_EQ(GetErrorKind(type), ErrorKind::kUnsupportedType);
  const absl::Status name = UnboundNameError("psum: unbound axis name 'j'");
  EXPECT_EQ(name.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(GetErrorKind(name), ErrorKind::kUnboundName);
}

TEST(ErrorKindTest, PlainStatusesHaveNoKind) {
  EXPECT_EQ(GetErrorKind(absl::OkStatus()), ErrorKind::kNone);
  EXPECT_EQ(GetErrorKind(absl::InvalidArgumentError("bad")), ErrorKind::kNone);
  EXPECT_EQ(GetErrorKind(absl::NotFoundError("gone")), ErrorKind::kNone);
}

TEST(ErrorKindTest, HostLostIsUnavailableOfItsKind) {
  const absl::Status lost = HostLostError("host 2 (127.0.0.1:5000) was lost");
  EXPECT_EQ(lost.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(lost.message(), "host 2 (127.0.0.1:5000) was lost");
  EXPECT_EQ(GetErrorKind(lost), ErrorKind::kHostLost);
  EXPECT_EQ(GetErrorKind(absl::UnavailableError("device 3 failed")), ErrorKind::kNone);
}

absl::Status Propagates() {
  PW_RETURN_IF_ERROR(DTypeFromName("float16").status());
  return absl::OkStatus();
}

TEST(ErrorKindTest, KindSurvivesPropagation) {
  const absl::Status status = Propagates();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(GetErrorKind(status), ErrorKind::kUnsupportedType);
  const absl::StatusOr<int> copied = status;
  EXPECT_EQ(GetErrorKind(copied.status()), ErrorKind::kUnsupportedType);
}

}  // namespace
}  // namespace pw
