// libFuzzer target: arbitrary bytes as what a host reads of a peer with
// auth.h before the peer proved anything: a control plane session's
// opening (its nonce in hex and its claim, from the session's metadata),
// hex, the PEM of the certificate a TLS peer presented (whose fingerprint
// the proofs bind), and a sealed secret (hosts="ray": how the secret itself
// arrives). Checked, besides never crashing, reading out of bounds or
// leaking:
//   - ParseSessionOpening refuses with Unauthenticated only, and what it
//     accepts is a nonce of kNonceBytes that is the hex it came from and a
//     claim of "cluster" (-1) or a host id (>= 0), which parses the same
//     again from its canonical form;
//   - FromHex takes exactly the even-length strings of hex digits, and
//     ToHex(FromHex(x)) is x in lower case; FromHex(ToHex(x)) is x;
//   - a certificate's fingerprint is 32 bytes;
//   - a sealed secret that this key did not seal does not open
//     (InvalidArgument), and one it sealed opens to what was sealed.
// Built with ASan and UBSan by `make fuzz`.

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "csrc/coordination/auth.h"

namespace pw {
namespace {

[[noreturn]] void Fail(const char* what, const std::string& detail) {
  std::fprintf(stderr, "auth_fuzzer: %s\n%s\n", what, detail.c_str());
  std::abort();
}

bool IsHex(absl::string_view s) {
  for (char c : s) {
    if (!absl::ascii_isxdigit(static_cast<unsigned char>(c))) return false;
  }
  return true;
}

void CheckSessionOpening(absl::string_view nonce_hex, absl::string_view claim) {
  absl::StatusOr<SessionOpening> opening = ParseSessionOpening(nonce_hex, claim);
  if (!opening.ok()) {
    if (opening.status().code() != absl::StatusCode::kUnauthenticated || opening.status().message().empty()) {
      Fail("a refused opening is not Unauthenticated with a reason", opening.status().ToString());
    }
    return;
  }
  if (opening->nonce.size() != kNonceBytes) Fail("an opening's nonce is not 32 bytes", std::string(nonce_hex));
  if (ToHex(opening->nonce) != absl::AsciiStrToLower(nonce_hex)) {
    Fail("an opening's nonce is not the hex it came from", std::string(nonce_hex));
  }
  if ((opening->claim == -1) != (claim == "cluster") || opening->claim < -1) {
    Fail("an opening's claim is neither the cluster nor a host id", std::string(claim));
  }
  const std::string canonical = opening->claim < 0 ? "cluster" : absl::StrCat(opening->claim);
  absl::StatusOr<SessionOpening> again = ParseSessionOpening(ToHex(opening->nonce), canonical);
  if (!again.ok() || again->nonce != opening->nonce || again->claim != opening->claim) {
    Fail("an opening does not parse the same from its canonical form", canonical);
  }
}

// The nonce and claim as a session's metadata would carry them: the input
// cut at its first '|' (all of it the nonce if there is none); and, so that
// the claim's checks are reached at once, a nonce of the input's next 32
// bytes in hex (in upper case if its first byte is odd) with the rest of
// it, "cluster" or a number it holds as the claim.
void CheckSessionOpenings(absl::string_view in) {
  const size_t bar = in.find('|');
  CheckSessionOpening(in.substr(0, bar), bar == absl::string_view::npos ? absl::string_view() : in.substr(bar + 1));
  if (in.empty()) return;
  const uint8_t how = static_cast<uint8_t>(in[0]);
  std::string nonce_hex = ToHex(in.substr(1, kNonceBytes));
  if (how & 1) nonce_hex = absl::AsciiStrToUpper(nonce_hex);
  const absl::string_view rest = in.size() > 1 + kNonceBytes ? in.substr(1 + kNonceBytes) : absl::string_view();
  uint64_t number = 0;
  for (char c : rest.substr(0, 8)) number = number * 256 + static_cast<uint8_t>(c);
  const std::string claim = (how & 6) == 2   ? std::string("cluster")
                            : (how & 6) == 4 ? absl::StrCat(how & 8 ? "-" : "", number % (how & 16 ? 1000 : ~0ull))
                                             : std::string(rest);
  CheckSessionOpening(nonce_hex, claim);
}

void CheckHex(absl::string_view in) {
  absl::StatusOr<std::string> bytes = FromHex(in);
  if (bytes.ok() != (in.size() % 2 == 0 && IsHex(in))) Fail("FromHex took or refused the wrong strings", "");
  if (bytes.ok()) {
    if (bytes->size() != in.size() / 2) Fail("FromHex gave the wrong number of bytes", "");
    if (ToHex(*bytes) != absl::AsciiStrToLower(in)) Fail("ToHex(FromHex(x)) is not x", "");
  } else if (bytes.status().code() != absl::StatusCode::kInvalidArgument) {
    Fail("FromHex failed with another code than InvalidArgument", bytes.status().ToString());
  }
  absl::StatusOr<std::string> back = FromHex(ToHex(in));
  if (!back.ok() || *back != in) Fail("FromHex(ToHex(x)) is not x", "");
}

void CheckCertificate(absl::string_view in) {
  absl::StatusOr<std::string> fingerprint = CertificateSha256(in);
  if (fingerprint.ok() && fingerprint->size() != 32) Fail("a fingerprint is not 32 bytes", "");
}

void CheckSealed(absl::string_view in) {
  // One key for the whole run: making one per input would be most of the work.
  static SecretUnsealer* const unsealer = [] {
    absl::StatusOr<std::unique_ptr<SecretUnsealer>> made = SecretUnsealer::Create();
    if (!made.ok()) Fail("no sealing key", made.status().ToString());
    return made->release();
  }();
  absl::StatusOr<std::string> opened = unsealer->Open(in);
  if (opened.ok()) Fail("bytes this key never sealed opened", "");
  if (opened.status().code() != absl::StatusCode::kInvalidArgument) {
    Fail("a sealed secret failed to open with another code than InvalidArgument", opened.status().ToString());
  }
  absl::StatusOr<std::string> sealed = SealSecret(unsealer->public_key(), in);
  if (!sealed.ok()) Fail("sealing failed", sealed.status().ToString());
  absl::StatusOr<std::string> back = unsealer->Open(*sealed);
  if (!back.ok() || *back != in) Fail("a sealed secret does not open to what was sealed", "");
}

}  // namespace
}  // namespace pw

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view in(reinterpret_cast<const char*>(data), size);
  pw::CheckSessionOpenings(in);
  pw::CheckHex(in);
  pw::CheckCertificate(in);
  pw::CheckSealed(in);
  return 0;
}
