// The planes' cryptography: known answers for the primitives, what each
// handshake proof depends on, TLS identities, and sealing.

#include "csrc/coordination/auth.h"

#include <set>
#include <string>

#include "absl/strings/ascii.h"
#include "gtest/gtest.h"

namespace pw {
namespace {

TEST(Auth, PrimitivesGiveTheKnownAnswers) {
  // FIPS 180-2 and RFC 4231 (test case 2).
  EXPECT_EQ(ToHex(Sha256("abc")), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(ToHex(HmacSha256("Jefe", "what do ya want for nothing?")),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
  EXPECT_EQ(HmacSha256("", "x").size(), kProofBytes);
}

TEST(Auth, RandomBytesAreFreshEveryTime) {
  std::set<std::string> seen;
  for (int i = 0; i < 100; ++i) {
    absl::StatusOr<std::string> bytes = RandomBytes(kNonceBytes);
    ASSERT_TRUE(bytes.ok()) << bytes.status();
    EXPECT_EQ(bytes->size(), kNonceBytes);
    seen.insert(*bytes);
  }
  EXPECT_EQ(seen.size(), 100u);
}

TEST(Auth, ConstantTimeEqualsAndHex) {
  EXPECT_TRUE(ConstantTimeEquals("", ""));
  EXPECT_TRUE(ConstantTimeEquals("abc", "abc"));
  EXPECT_FALSE(ConstantTimeEquals("abc", "abd"));
  EXPECT_FALSE(ConstantTimeEquals("abc", "abcd"));
  EXPECT_EQ(ToHex(std::string("\x00\xff\x10", 3)), "00ff10");
  EXPECT_EQ(*FromHex("00fF10"), std::string("\x00\xff\x10", 3));
  EXPECT_EQ(FromHex("abc").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(FromHex("zz").status().code(), absl::StatusCode::kInvalidArgument);
}

// What a host reads of a control plane session before the dialer proved
// anything: a 64-hex-digit nonce and "cluster" or a host id; anything else is
// refused, saying what was wrong.
TEST(Auth, ASessionOpensWithANonceAndAClaimOnly) {
  const std::string nonce(kNonceBytes, '\x5a');
  absl::StatusOr<SessionOpening> cluster = ParseSessionOpening(ToHex(nonce), "cluster");
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  EXPECT_EQ(cluster->nonce, nonce);
  EXPECT_EQ(cluster->claim, -1);
  absl::StatusOr<SessionOpening> host = ParseSessionOpening(absl::AsciiStrToUpper(ToHex(nonce)), "7");
  ASSERT_TRUE(host.ok()) << host.status();
  EXPECT_EQ(host->nonce, nonce);
  EXPECT_EQ(host->claim, 7);
  absl::StatusOr<SessionOpening> tenant = ParseSessionOpening(ToHex(nonce), "tenant-3");
  ASSERT_TRUE(tenant.ok()) << tenant.status();
  EXPECT_EQ(tenant->claim, TenantClaim(3));
  EXPECT_EQ(ClaimedTenant(tenant->claim), 3u);
  EXPECT_EQ(ClaimedTenant(-1), 0u);  // the cluster is no tenant
  EXPECT_EQ(ClaimedTenant(7), 0u);   // nor is a host
  const struct {
    std::string nonce_hex, claim, why;
  } refused[] = {
      {"", "cluster", "no handshake"},
      {ToHex(nonce), "", "no handshake"},
      {ToHex(nonce).substr(2), "cluster", "nonce"},
      {ToHex(nonce) + "00", "cluster", "nonce"},
      {ToHex(nonce).substr(1) + "g", "cluster", "nonce"},
      {ToHex(nonce), "root", "neither 'cluster', a host id nor 'tenant-<id>'"},
      {ToHex(nonce), "tenant-0", "tenant-<id>"},
      {ToHex(nonce), "tenant--2", "tenant-<id>"},
      {ToHex(nonce), "tenant-", "tenant-<id>"},
      {ToHex(nonce), "-1", "neither"},
      {ToHex(nonce), "99999999999", "neither"},  // not an int
      {ToHex(nonce), "Cluster", "neither"},
  };
  for (const auto& r : refused) {
    absl::StatusOr<SessionOpening> opening = ParseSessionOpening(r.nonce_hex, r.claim);
    EXPECT_EQ(opening.status().code(), absl::StatusCode::kUnauthenticated) << r.nonce_hex << " " << r.claim;
    EXPECT_NE(opening.status().message().find(r.why), std::string::npos) << opening.status();
  }
}

TEST(Auth, AProofHoldsForItsOwnKeyRoleAndTranscriptOnly) {
  HandshakeTranscript t;
  t.plane = "control";
  t.dialer_nonce = std::string(kNonceBytes, 'd');
  t.listener_nonce = std::string(kNonceBytes, 'l');
  const std::string proof = HandshakeProof("key", ProofBy::kDialer, t);
  EXPECT_EQ(proof.size(), kProofBytes);
  EXPECT_EQ(proof, HandshakeProof("key", ProofBy::kDialer, t));
  std::set<std::string> others = {proof, HandshakeProof("kez", ProofBy::kDialer, t),
                                  HandshakeProof("key", ProofBy::kListener, t)};
  auto with = [&](auto change) {
    HandshakeTranscript u = t;
    change(u);
    others.insert(HandshakeProof("key", ProofBy::kDialer, u));
  };
  with([](HandshakeTranscript& u) { u.plane = "data"; });
  with([](HandshakeTranscript& u) { u.claim = 0; });
  with([](HandshakeTranscript& u) { u.listener = 0; });
  with([](HandshakeTranscript& u) { u.dialer_nonce[0] ^= 1; });
  with([](HandshakeTranscript& u) { u.listener_nonce[31] ^= 1; });
  with([](HandshakeTranscript& u) { u.binding.assign(1, 'x'); });
  // Fields are length-prefixed: moving a byte across a boundary changes it.
  with([](HandshakeTranscript& u) {
    u.dialer_nonce.push_back('l');
    u.listener_nonce.pop_back();
  });
  EXPECT_EQ(others.size(), 10u);
}

TEST(Auth, ASelfSignedIdentityHasAFingerprintOfItsOwn) {
  absl::StatusOr<TlsIdentity> a = MakeSelfSignedTlsIdentity();
  absl::StatusOr<TlsIdentity> b = MakeSelfSignedTlsIdentity();
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_NE(a->certificate_pem.find("BEGIN CERTIFICATE"), std::string::npos);
  EXPECT_NE(a->private_key_pem.find("PRIVATE KEY"), std::string::npos);
  EXPECT_EQ(a->certificate_sha256.size(), 32u);
  EXPECT_EQ(*CertificateSha256(a->certificate_pem), a->certificate_sha256);
  EXPECT_NE(a->certificate_sha256, b->certificate_sha256);
  EXPECT_EQ(CertificateSha256("not a certificate").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(Auth, OnlyTheHolderOfTheKeyOpensASealedSecretAndOnlyUnaltered) {
  absl::StatusOr<std::unique_ptr<SecretUnsealer>> host = SecretUnsealer::Create();
  absl::StatusOr<std::unique_ptr<SecretUnsealer>> other = SecretUnsealer::Create();
  ASSERT_TRUE(host.ok() && other.ok());
  EXPECT_EQ((*host)->public_key().size(), kSealingPublicKeyBytes);
  const std::string secret = "the cluster's secret";
  absl::StatusOr<std::string> sealed = SealSecret((*host)->public_key(), secret);
  ASSERT_TRUE(sealed.ok()) << sealed.status();
  EXPECT_EQ(sealed->find(secret), std::string::npos);
  EXPECT_EQ(*(*host)->Open(*sealed), secret);
  // Sealing twice gives different bytes (a fresh ephemeral key each time).
  EXPECT_NE(*SealSecret((*host)->public_key(), secret), *sealed);

  absl::StatusOr<std::string> wrong_key = (*other)->Open(*sealed);
  EXPECT_EQ(wrong_key.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(wrong_key.status().message().find("does not open"), std::string::npos) << wrong_key.status();
  for (size_t i : {size_t{0}, size_t{40}, sealed->size() - 1}) {
    std::string altered = *sealed;
    altered[i] ^= 1;
    EXPECT_FALSE((*host)->Open(altered).ok()) << "byte " << i;
  }
  EXPECT_EQ((*host)->Open("short").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(SealSecret("not 32 bytes", secret).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace pw
