// libFuzzer target: arbitrary bytes as what a data plane host reads from a
// peer (data_wire, data_plane.h), most of it before the peer proved
// anything: the hello and proof message a listener reads as they arrive, the
// challenge and ack a dialer reads, and message headers. The input is read
// as it is, and also as each of those messages of this version, made from
// the input's bytes and then changed in one byte the input picks (so that
// the checks past a magic and version are reached at once, and each one
// byte off). Checked, besides never crashing or reading out of bounds:
//   - a listener's verdict on the bytes so far is final once it is not
//     kNeedMore (more bytes never change it), kNeedMore only while bytes
//     are missing, kOtherVersion as soon as a version other than this one
//     is in, and bytes past the message's size are not looked at;
//   - a message read whole has its parts of their fixed sizes (a nonce or
//     proof of 32 bytes, a hello of this version) and writes back as the
//     bytes it was read from; kNotOurs exactly when the bytes stray from
//     the magic that the writer writes;
//   - whatever is written reads back the same (read(write(x)) == x).
// Built with ASan and UBSan by `make fuzz`.

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>

#include "absl/types/span.h"
#include "csrc/coordination/data_plane.h"

namespace pw {
namespace {

using data_wire::Progress;

[[noreturn]] void Fail(const char* what) {
  std::fprintf(stderr, "data_plane_wire_fuzzer: %s\n", what);
  std::abort();
}

void Check(bool ok, const char* what) {
  if (!ok) Fail(what);
}

template <size_t N>
bool SameBytes(const std::array<uint8_t, N>& written, absl::Span<const uint8_t> in) {
  return in.size() >= N && std::memcmp(written.data(), in.data(), N) == 0;
}

// The bytes of `in` from `at`, as many as `n` (fewer past its end).
std::string Take(absl::Span<const uint8_t> in, size_t at, size_t n) {
  if (at >= in.size()) return std::string();
  n = std::min(n, in.size() - at);
  return std::string(reinterpret_cast<const char*>(in.data() + at), n);
}

uint64_t Take64(absl::Span<const uint8_t> in, size_t at) {
  uint64_t v = 0;
  const std::string b = Take(in, at, 8);
  for (size_t i = 0; i < b.size(); ++i) v |= static_cast<uint64_t>(static_cast<uint8_t>(b[i])) << (8 * i);
  return v;
}

// Whether the first bytes of `in` (up to 8) are those of `magic`.
bool MagicSoFar(absl::Span<const uint8_t> in, absl::Span<const uint8_t> magic) {
  const size_t n = std::min<size_t>(in.size(), 8);
  return n == 0 || std::memcmp(in.data(), magic.data(), n) == 0;
}

// The hello, as a listener reads it: every prefix of `in`, as recv() may
// hand the bytes over.
void CheckHello(absl::Span<const uint8_t> in) {
  const std::array<uint8_t, data_wire::kHelloBytes> magic = data_wire::WriteHello({});
  Progress final = Progress::kNeedMore;
  for (size_t n = 0; n <= std::min(in.size(), data_wire::kHelloBytes + 8); ++n) {
    data_wire::Hello hello;
    const Progress progress = data_wire::ReadHello(in.first(n), &hello);
    if (final != Progress::kNeedMore) {
      Check(progress == final, "a hello's verdict changed with more bytes");
      continue;
    }
    final = progress;
    const bool ours = MagicSoFar(in.first(n), magic);
    Check((progress == Progress::kNotOurs) == !ours, "kNotOurs is not 'strays from the magic'");
    // The writer's hello holds this version at byte 8.
    const bool other_version = n >= 12 && std::memcmp(in.data() + 8, magic.data() + 8, 4) != 0;
    if (ours) {
      Check((progress == Progress::kOtherVersion) == other_version,
            "kOtherVersion is not 'its version is in and is not this one'");
    }
    switch (progress) {
      case Progress::kNeedMore:
        Check(n < data_wire::kHelloBytes, "kNeedMore with the whole hello in");
        break;
      case Progress::kOtherVersion:
        Check(n >= 12, "kOtherVersion before the version is in");
        break;
      case Progress::kWhole:
        Check(n == data_wire::kHelloBytes, "a hello read whole at another size");
        Check(hello.version == data_wire::kVersion, "a hello of another version read whole");
        Check(hello.nonce.size() == data_wire::kHandshakeBytes, "a hello's nonce is not 32 bytes");
        Check(SameBytes(data_wire::WriteHello(hello), in), "a hello read whole does not write back as its bytes");
        break;
      case Progress::kNotOurs:
        break;
    }
  }
}

// The proof message, likewise.
void CheckProof(absl::Span<const uint8_t> in) {
  const std::array<uint8_t, data_wire::kProofMessageBytes> magic = data_wire::WriteProof("");
  Progress final = Progress::kNeedMore;
  for (size_t n = 0; n <= std::min(in.size(), data_wire::kProofMessageBytes + 8); ++n) {
    std::string proof;
    const Progress progress = data_wire::ReadProof(in.first(n), &proof);
    if (final != Progress::kNeedMore) {
      Check(progress == final, "a proof message's verdict changed with more bytes");
      continue;
    }
    final = progress;
    Check((progress == Progress::kNotOurs) == !MagicSoFar(in.first(n), magic),
          "kNotOurs is not 'strays from the magic' (proof)");
    Check(progress != Progress::kOtherVersion, "a proof message has no version");
    if (progress == Progress::kNeedMore) Check(n < data_wire::kProofMessageBytes, "kNeedMore with the proof in");
    if (progress == Progress::kWhole) {
      Check(n == data_wire::kProofMessageBytes, "a proof message read whole at another size");
      Check(proof.size() == data_wire::kHandshakeBytes, "a proof is not 32 bytes");
      Check(SameBytes(data_wire::WriteProof(proof), in), "a proof message does not write back as its bytes");
    }
  }
}

// The listener's answers, as a dialer reads them (whole, 52 bytes).
void CheckAnswers(absl::Span<const uint8_t> in) {
  for (const data_wire::AnswerKind kind : {data_wire::AnswerKind::kChallenge, data_wire::AnswerKind::kAck}) {
    const data_wire::AnswerKind other = kind == data_wire::AnswerKind::kChallenge ? data_wire::AnswerKind::kAck
                                                                                  : data_wire::AnswerKind::kChallenge;
    // At every size but its own, nothing.
    for (size_t n : {size_t{0}, data_wire::kAnswerBytes - 1, data_wire::kAnswerBytes + 1}) {
      if (n <= in.size()) Check(!data_wire::ReadAnswer(kind, in.first(n)).has_value(), "an answer of another size");
    }
    if (in.size() < data_wire::kAnswerBytes) continue;
    const absl::Span<const uint8_t> bytes = in.first(data_wire::kAnswerBytes);
    const std::optional<data_wire::Answer> answer = data_wire::ReadAnswer(kind, bytes);
    const std::array<uint8_t, data_wire::kAnswerBytes> magic = data_wire::WriteAnswer(kind, {});
    Check(answer.has_value() == (std::memcmp(bytes.data(), magic.data(), 8) == 0), "an answer is not its magic");
    if (!answer.has_value()) continue;
    Check(answer->bytes.size() == data_wire::kHandshakeBytes, "an answer's nonce or proof is not 32 bytes");
    Check(SameBytes(data_wire::WriteAnswer(kind, *answer), bytes), "an answer does not write back as its bytes");
    Check(!data_wire::ReadAnswer(other, bytes).has_value(), "an answer read as both kinds");
  }
}

// Message headers, as a receiver reads them (whole, 48 bytes).
void CheckHeader(absl::Span<const uint8_t> in) {
  if (in.size() >= data_wire::kHeaderBytes - 1) {
    Check(!data_wire::ReadHeader(in.first(data_wire::kHeaderBytes - 1)).has_value(), "a short header read");
  }
  if (in.size() < data_wire::kHeaderBytes) return;
  const absl::Span<const uint8_t> bytes = in.first(data_wire::kHeaderBytes);
  const std::optional<DataMessageHeader> header = data_wire::ReadHeader(bytes);
  if (header.has_value()) {
    Check(SameBytes(data_wire::WriteHeader(*header), bytes), "a header does not write back as its bytes");
  }
}

// Whatever a host writes reads back the same, for fields taken from `in`.
void CheckWritten(absl::Span<const uint8_t> in) {
  data_wire::Hello hello;
  hello.dialer = static_cast<uint32_t>(Take64(in, 0));
  hello.nonce = Take(in, 4, data_wire::kHandshakeBytes);
  hello.nonce.resize(data_wire::kHandshakeBytes, '\0');
  const std::array<uint8_t, data_wire::kHelloBytes> hello_bytes = data_wire::WriteHello(hello);
  data_wire::Hello read;
  Check(data_wire::ReadHello(hello_bytes, &read) == Progress::kWhole && read == hello, "hello: read(write(x)) != x");

  std::string proof;
  Check(data_wire::ReadProof(data_wire::WriteProof(hello.nonce), &proof) == Progress::kWhole && proof == hello.nonce,
        "proof: read(write(x)) != x");

  data_wire::Answer answer;
  answer.version = static_cast<uint32_t>(Take64(in, 8));
  answer.host_id = static_cast<uint32_t>(Take64(in, 12));
  answer.status = static_cast<uint32_t>(Take64(in, 16));
  answer.bytes = hello.nonce;
  for (const data_wire::AnswerKind kind : {data_wire::AnswerKind::kChallenge, data_wire::AnswerKind::kAck}) {
    const std::optional<data_wire::Answer> back = data_wire::ReadAnswer(kind, data_wire::WriteAnswer(kind, answer));
    Check(back.has_value() && *back == answer, "answer: read(write(x)) != x");
  }

  DataMessageHeader header;
  header.flag = static_cast<uint8_t>(Take64(in, 20));
  header.ids = {Take64(in, 21), Take64(in, 29), Take64(in, 37), Take64(in, 45)};
  header.length = Take64(in, 53);
  const std::optional<DataMessageHeader> back = data_wire::ReadHeader(data_wire::WriteHeader(header));
  Check(back.has_value() && *back == header, "header: read(write(x)) != x");
}

// Every reader on `in`.
void CheckRead(absl::Span<const uint8_t> in) {
  CheckHello(in);
  CheckProof(in);
  CheckAnswers(in);
  CheckHeader(in);
}

// `message` as written, then with its byte at in[0] (modulo its size) set to
// in[1], and cut to in[2] bytes if that is fewer: every reader on each.
template <size_t N>
void CheckNearlyWritten(const std::array<uint8_t, N>& message, absl::Span<const uint8_t> in) {
  CheckRead(message);
  if (in.size() < 3) return;
  std::array<uint8_t, N> changed = message;
  changed[in[0] % N] = in[1];
  CheckRead(absl::Span<const uint8_t>(changed).first(std::min<size_t>(N, in[2])));
  CheckRead(changed);
}

void CheckMessagesOfThisVersion(absl::Span<const uint8_t> in) {
  const absl::Span<const uint8_t> fields = in.subspan(std::min<size_t>(in.size(), 3));
  data_wire::Hello hello;
  hello.dialer = static_cast<uint32_t>(Take64(fields, 0));
  hello.nonce = Take(fields, 4, data_wire::kHandshakeBytes);
  CheckNearlyWritten(data_wire::WriteHello(hello), in);
  CheckNearlyWritten(data_wire::WriteProof(hello.nonce), in);
  data_wire::Answer answer;
  answer.host_id = hello.dialer;
  answer.status = static_cast<uint32_t>(Take64(fields, 36)) % 7;  // the statuses there are, and one more
  answer.bytes = hello.nonce;
  CheckNearlyWritten(data_wire::WriteAnswer(data_wire::AnswerKind::kChallenge, answer), in);
  CheckNearlyWritten(data_wire::WriteAnswer(data_wire::AnswerKind::kAck, answer), in);
  DataMessageHeader header;
  header.flag = static_cast<uint8_t>(Take64(fields, 40));
  header.ids = {Take64(fields, 0), Take64(fields, 8), Take64(fields, 16), Take64(fields, 24)};
  header.length = Take64(fields, 32);
  CheckNearlyWritten(data_wire::WriteHeader(header), in);
}

}  // namespace
}  // namespace pw

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::Span<const uint8_t> in(data, size);
  pw::CheckRead(in);
  pw::CheckWritten(in);
  pw::CheckMessagesOfThisVersion(in);
  return 0;
}
