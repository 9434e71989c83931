#include "csrc/coordination/auth.h"

#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/kdf.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/x509.h>

#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace pw {
namespace {

// The oldest error OpenSSL queued, as text (and the queue cleared).
std::string OpenSslError() {
  const unsigned long code = ERR_get_error();
  ERR_clear_error();
  if (code == 0) return "unknown OpenSSL error";
  char text[256];
  ERR_error_string_n(code, text, sizeof(text));
  return text;
}

absl::Status Failed(absl::string_view what) {
  return absl::InternalError(absl::StrCat(what, ": ", OpenSslError()));
}

struct PkeyFree {
  void operator()(EVP_PKEY* p) const { EVP_PKEY_free(p); }
};
struct PkeyCtxFree {
  void operator()(EVP_PKEY_CTX* p) const { EVP_PKEY_CTX_free(p); }
};
struct CipherCtxFree {
  void operator()(EVP_CIPHER_CTX* p) const { EVP_CIPHER_CTX_free(p); }
};
struct X509Free {
  void operator()(X509* p) const { X509_free(p); }
};
struct BioFree {
  void operator()(BIO* p) const { BIO_free(p); }
};
using Pkey = std::unique_ptr<EVP_PKEY, PkeyFree>;
using PkeyCtx = std::unique_ptr<EVP_PKEY_CTX, PkeyCtxFree>;
using CipherCtx = std::unique_ptr<EVP_CIPHER_CTX, CipherCtxFree>;
using X509Ptr = std::unique_ptr<X509, X509Free>;
using Bio = std::unique_ptr<BIO, BioFree>;

const unsigned char* Bytes(absl::string_view s) { return reinterpret_cast<const unsigned char*>(s.data()); }

std::string BioText(BIO* bio) {
  char* data = nullptr;
  const long n = BIO_get_mem_data(bio, &data);
  return n > 0 ? std::string(data, static_cast<size_t>(n)) : std::string();
}

// Length-prefixed (8 bytes, little-endian), so concatenations are unambiguous.
void AppendField(std::string* out, absl::string_view field) {
  const uint64_t n = field.size();
  for (int i = 0; i < 8; ++i) out->push_back(static_cast<char>(n >> (8 * i)));
  out->append(field.data(), field.size());
}

void AppendInt(std::string* out, int64_t v) { AppendField(out, absl::StrCat(v)); }

// What a handshake's proofs cover (the plane goes first, on its own).
void AppendTranscript(std::string* out, const HandshakeTranscript& t) {
  AppendInt(out, t.claim);
  AppendInt(out, t.listener);
  AppendField(out, t.dialer_nonce);
  AppendField(out, t.listener_nonce);
  AppendField(out, t.binding);
}

constexpr absl::string_view kSealInfo = "pathways sealed secret v1";
constexpr size_t kGcmKeyBytes = 32, kGcmNonceBytes = 12, kGcmTagBytes = 16;

// The AES key and nonce of one sealing: HKDF-SHA256 over the X25519 shared
// secret, salted with both public keys (the key is used once, so a derived
// nonce is safe).
absl::StatusOr<std::string> SealingKeys(absl::string_view shared, absl::string_view ephemeral_public,
                                        absl::string_view recipient_public) {
  PkeyCtx ctx(EVP_PKEY_CTX_new_id(EVP_PKEY_HKDF, nullptr));
  const std::string salt = absl::StrCat(ephemeral_public, recipient_public);
  std::string out(kGcmKeyBytes + kGcmNonceBytes, '\0');
  size_t n = out.size();
  if (ctx == nullptr || EVP_PKEY_derive_init(ctx.get()) <= 0 ||
      EVP_PKEY_CTX_set_hkdf_md(ctx.get(), EVP_sha256()) <= 0 ||
      EVP_PKEY_CTX_set1_hkdf_salt(ctx.get(), Bytes(salt), static_cast<int>(salt.size())) <= 0 ||
      EVP_PKEY_CTX_set1_hkdf_key(ctx.get(), Bytes(shared), static_cast<int>(shared.size())) <= 0 ||
      EVP_PKEY_CTX_add1_hkdf_info(ctx.get(), Bytes(kSealInfo), static_cast<int>(kSealInfo.size())) <= 0 ||
      EVP_PKEY_derive(ctx.get(), reinterpret_cast<unsigned char*>(out.data()), &n) <= 0 || n != out.size()) {
    return Failed("HKDF");
  }
  return out;
}

// X25519(private, peer public).
absl::StatusOr<std::string> Agree(EVP_PKEY* own, absl::string_view peer_public) {
  Pkey peer(EVP_PKEY_new_raw_public_key(EVP_PKEY_X25519, nullptr, Bytes(peer_public), peer_public.size()));
  if (peer == nullptr) return absl::InvalidArgumentError("not an X25519 public key");
  PkeyCtx ctx(EVP_PKEY_CTX_new(own, nullptr));
  size_t n = 0;
  if (ctx == nullptr || EVP_PKEY_derive_init(ctx.get()) <= 0 || EVP_PKEY_derive_set_peer(ctx.get(), peer.get()) <= 0 ||
      EVP_PKEY_derive(ctx.get(), nullptr, &n) <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("X25519 key agreement: ", OpenSslError()));
  }
  std::string shared(n, '\0');
  if (EVP_PKEY_derive(ctx.get(), reinterpret_cast<unsigned char*>(shared.data()), &n) <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("X25519 key agreement: ", OpenSslError()));
  }
  shared.resize(n);
  return shared;
}

absl::StatusOr<std::string> RawPublicKey(EVP_PKEY* key) {
  std::string out(kSealingPublicKeyBytes, '\0');
  size_t n = out.size();
  if (EVP_PKEY_get_raw_public_key(key, reinterpret_cast<unsigned char*>(out.data()), &n) <= 0 ||
      n != out.size()) {
    return Failed("X25519 public key");
  }
  return out;
}

}  // namespace

absl::StatusOr<std::string> RandomBytes(size_t n) {
  std::string out(n, '\0');
  if (n > 0 && RAND_bytes(reinterpret_cast<unsigned char*>(out.data()), static_cast<int>(n)) != 1) {
    return Failed("RAND_bytes");
  }
  return out;
}

std::string Sha256(absl::string_view data) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  EVP_Digest(data.data(), data.size(), md, &n, EVP_sha256(), nullptr);
  return std::string(reinterpret_cast<char*>(md), n);
}

std::string HmacSha256(absl::string_view key, absl::string_view data) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  // A key of no bytes still makes a MAC (of an empty key); HMAC needs a
  // non-null pointer for it.
  static const char kEmpty = 0;
  HMAC(EVP_sha256(), key.empty() ? &kEmpty : key.data(), static_cast<int>(key.size()), Bytes(data), data.size(), md,
       &n);
  return std::string(reinterpret_cast<char*>(md), n);
}

bool ConstantTimeEquals(absl::string_view a, absl::string_view b) {
  if (a.size() != b.size()) return false;
  return a.empty() || CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

std::string ToHex(absl::string_view bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char c : bytes) {
    out.push_back(kDigits[c >> 4]);
    out.push_back(kDigits[c & 15]);
  }
  return out;
}

absl::StatusOr<std::string> FromHex(absl::string_view hex) {
  auto digit = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  if (hex.size() % 2 != 0) return absl::InvalidArgumentError("an odd number of hex digits");
  std::string out(hex.size() / 2, '\0');
  for (size_t i = 0; i < out.size(); ++i) {
    const int hi = digit(hex[2 * i]), lo = digit(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) return absl::InvalidArgumentError("not a hex digit");
    out[i] = static_cast<char>(hi * 16 + lo);
  }
  return out;
}

absl::StatusOr<SessionOpening> ParseSessionOpening(absl::string_view nonce_hex, absl::string_view claim) {
  if (nonce_hex.empty() || claim.empty()) {
    return absl::UnauthenticatedError(
        "the session has no handshake (pw-auth-nonce and pw-auth-claim metadata): a client of another version, or "
        "not a pathways client");
  }
  SessionOpening opening;
  absl::StatusOr<std::string> nonce = FromHex(nonce_hex);
  if (!nonce.ok() || nonce->size() != kNonceBytes) {
    return absl::UnauthenticatedError(absl::StrCat("the session's nonce is not ", 2 * kNonceBytes, " hex digits"));
  }
  opening.nonce = *std::move(nonce);
  int host = -1;
  uint64_t tenant = 0;
  if (claim == "cluster") {
    opening.claim = -1;
  } else if (absl::SimpleAtoi(claim, &host) && host >= 0) {
    opening.claim = host;
  } else if (absl::ConsumePrefix(&claim, "tenant-") && absl::SimpleAtoi(claim, &tenant) && tenant >= 1 &&
             tenant <= kMaxTenant) {
    opening.claim = TenantClaim(tenant);
  } else {
    return absl::UnauthenticatedError(
        absl::StrCat("the session claims to be '", claim, "', neither 'cluster', a host id nor 'tenant-<id>'"));
  }
  return opening;
}

std::string HandshakeProof(absl::string_view key, ProofBy by, const HandshakeTranscript& t) {
  std::string message;
  AppendField(&message, "pathways-auth-v1");
  AppendField(&message, t.plane);
  AppendField(&message, by == ProofBy::kDialer ? "dialer" : "listener");
  AppendTranscript(&message, t);
  return HmacSha256(key, message);
}

std::string HeartbeatKey(absl::string_view key, const HandshakeTranscript& t) {
  std::string message;
  AppendField(&message, "pathways-heartbeat-v1");
  AppendField(&message, t.plane);
  AppendTranscript(&message, t);
  return HmacSha256(key, message);
}

std::string HeartbeatPingMac(absl::string_view heartbeat_key, uint64_t session, uint64_t counter, uint64_t sent_ns) {
  std::string message;
  AppendField(&message, "ping");
  AppendField(&message, absl::StrCat(session));
  AppendField(&message, absl::StrCat(counter));
  AppendField(&message, absl::StrCat(sent_ns));
  return HmacSha256(heartbeat_key, message);
}

std::string HeartbeatPongMac(absl::string_view heartbeat_key, uint64_t session, uint64_t counter, uint64_t sent_ns,
                             uint64_t incarnation, int64_t host_ns) {
  std::string message;
  AppendField(&message, "pong");
  AppendField(&message, absl::StrCat(session));
  AppendField(&message, absl::StrCat(counter));
  AppendField(&message, absl::StrCat(sent_ns));
  AppendField(&message, absl::StrCat(incarnation));
  AppendInt(&message, host_ns);
  return HmacSha256(heartbeat_key, message);
}

absl::StatusOr<TlsIdentity> MakeSelfSignedTlsIdentity() {
  Pkey key(EVP_PKEY_Q_keygen(nullptr, nullptr, "EC", "P-256"));
  if (key == nullptr) return Failed("making an EC P-256 key");
  X509Ptr cert(X509_new());
  if (cert == nullptr) return Failed("X509_new");
  absl::StatusOr<std::string> serial = RandomBytes(8);
  if (!serial.ok()) return serial.status();
  uint64_t serial_number = 0;
  for (char c : *serial) serial_number = (serial_number << 8) | static_cast<unsigned char>(c);
  X509_NAME* name = X509_get_subject_name(cert.get());
  if (X509_set_version(cert.get(), 2) != 1 ||
      ASN1_INTEGER_set_uint64(X509_get_serialNumber(cert.get()), serial_number >> 1) != 1 ||
      X509_gmtime_adj(X509_getm_notBefore(cert.get()), -3600) == nullptr ||
      X509_gmtime_adj(X509_getm_notAfter(cert.get()), int64_t{10} * 365 * 86400) == nullptr ||
      X509_set_pubkey(cert.get(), key.get()) != 1 ||
      X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC, reinterpret_cast<const unsigned char*>("pathways-host"),
                                 -1, -1, 0) != 1 ||
      X509_set_issuer_name(cert.get(), name) != 1 || X509_sign(cert.get(), key.get(), EVP_sha256()) <= 0) {
    return Failed("making a self-signed certificate");
  }
  Bio key_pem(BIO_new(BIO_s_mem())), cert_pem(BIO_new(BIO_s_mem()));
  if (key_pem == nullptr || cert_pem == nullptr ||
      PEM_write_bio_PrivateKey(key_pem.get(), key.get(), nullptr, nullptr, 0, nullptr, nullptr) != 1 ||
      PEM_write_bio_X509(cert_pem.get(), cert.get()) != 1) {
    return Failed("writing the TLS identity as PEM");
  }
  TlsIdentity identity;
  identity.private_key_pem = BioText(key_pem.get());
  identity.certificate_pem = BioText(cert_pem.get());
  absl::StatusOr<std::string> fingerprint = CertificateSha256(identity.certificate_pem);
  if (!fingerprint.ok()) return fingerprint.status();
  identity.certificate_sha256 = *std::move(fingerprint);
  return identity;
}

absl::StatusOr<std::string> CertificateSha256(absl::string_view pem) {
  Bio bio(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
  X509Ptr cert(bio == nullptr ? nullptr : PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr));
  if (cert == nullptr) {
    ERR_clear_error();
    return absl::InvalidArgumentError("no PEM certificate");
  }
  unsigned char* der = nullptr;
  const int n = i2d_X509(cert.get(), &der);
  if (n <= 0) return Failed("encoding a certificate as DER");
  std::string digest = Sha256(absl::string_view(reinterpret_cast<char*>(der), static_cast<size_t>(n)));
  OPENSSL_free(der);
  return digest;
}

// ---------------------------------------------------------------------------
// Sealing

struct SecretUnsealer::Key {
  Pkey pkey;
};

SecretUnsealer::SecretUnsealer(std::unique_ptr<Key> key, std::string public_key)
    : key_(std::move(key)), public_key_(std::move(public_key)) {}
SecretUnsealer::~SecretUnsealer() = default;

absl::StatusOr<std::unique_ptr<SecretUnsealer>> SecretUnsealer::Create() {
  auto key = std::make_unique<Key>();
  key->pkey.reset(EVP_PKEY_Q_keygen(nullptr, nullptr, "X25519"));
  if (key->pkey == nullptr) return Failed("making an X25519 key");
  absl::StatusOr<std::string> public_key = RawPublicKey(key->pkey.get());
  if (!public_key.ok()) return public_key.status();
  return std::unique_ptr<SecretUnsealer>(new SecretUnsealer(std::move(key), *std::move(public_key)));
}

absl::StatusOr<std::string> SealSecret(absl::string_view public_key, absl::string_view secret) {
  if (public_key.size() != kSealingPublicKeyBytes) {
    return absl::InvalidArgumentError(absl::StrCat("a sealing public key has ", kSealingPublicKeyBytes,
                                                   " bytes, not ", public_key.size()));
  }
  Pkey ephemeral(EVP_PKEY_Q_keygen(nullptr, nullptr, "X25519"));
  if (ephemeral == nullptr) return Failed("making an X25519 key");
  absl::StatusOr<std::string> ephemeral_public = RawPublicKey(ephemeral.get());
  if (!ephemeral_public.ok()) return ephemeral_public.status();
  absl::StatusOr<std::string> shared = Agree(ephemeral.get(), public_key);
  if (!shared.ok()) return shared.status();
  absl::StatusOr<std::string> keys = SealingKeys(*shared, *ephemeral_public, public_key);
  if (!keys.ok()) return keys.status();

  std::string out = *ephemeral_public;
  const size_t header = out.size();
  out.resize(header + secret.size() + kGcmTagBytes);
  auto* cipher_text = reinterpret_cast<unsigned char*>(out.data() + header);
  CipherCtx ctx(EVP_CIPHER_CTX_new());
  int n = 0, final_n = 0;
  if (ctx == nullptr ||
      EVP_EncryptInit_ex(ctx.get(), EVP_aes_256_gcm(), nullptr, Bytes(*keys), Bytes(*keys) + kGcmKeyBytes) != 1 ||
      EVP_EncryptUpdate(ctx.get(), nullptr, &n, Bytes(kSealInfo), static_cast<int>(kSealInfo.size())) != 1 ||
      EVP_EncryptUpdate(ctx.get(), cipher_text, &n, Bytes(secret), static_cast<int>(secret.size())) != 1 ||
      EVP_EncryptFinal_ex(ctx.get(), cipher_text + n, &final_n) != 1 ||
      EVP_CIPHER_CTX_ctrl(ctx.get(), EVP_CTRL_GCM_GET_TAG, kGcmTagBytes, cipher_text + secret.size()) != 1) {
    return Failed("AES-256-GCM");
  }
  return out;
}

absl::StatusOr<std::string> SecretUnsealer::Open(absl::string_view sealed) const {
  if (sealed.size() < kSealingPublicKeyBytes + kGcmTagBytes) {
    return absl::InvalidArgumentError(absl::StrCat("a sealed secret has at least ",
                                                   kSealingPublicKeyBytes + kGcmTagBytes, " bytes, not ",
                                                   sealed.size()));
  }
  const absl::string_view ephemeral_public = sealed.substr(0, kSealingPublicKeyBytes);
  const absl::string_view body = sealed.substr(kSealingPublicKeyBytes, sealed.size() - kSealingPublicKeyBytes -
                                                                           kGcmTagBytes);
  std::string tag(sealed.substr(sealed.size() - kGcmTagBytes));
  absl::StatusOr<std::string> shared = Agree(key_->pkey.get(), ephemeral_public);
  if (!shared.ok()) return shared.status();
  absl::StatusOr<std::string> keys = SealingKeys(*shared, ephemeral_public, public_key_);
  if (!keys.ok()) return keys.status();
  std::string secret(body.size(), '\0');
  auto* plain = reinterpret_cast<unsigned char*>(secret.data());
  CipherCtx ctx(EVP_CIPHER_CTX_new());
  int n = 0, final_n = 0;
  if (ctx == nullptr ||
      EVP_DecryptInit_ex(ctx.get(), EVP_aes_256_gcm(), nullptr, Bytes(*keys), Bytes(*keys) + kGcmKeyBytes) != 1 ||
      EVP_DecryptUpdate(ctx.get(), nullptr, &n, Bytes(kSealInfo), static_cast<int>(kSealInfo.size())) != 1 ||
      EVP_DecryptUpdate(ctx.get(), plain, &n, Bytes(body), static_cast<int>(body.size())) != 1 ||
      EVP_CIPHER_CTX_ctrl(ctx.get(), EVP_CTRL_GCM_SET_TAG, kGcmTagBytes, tag.data()) != 1 ||
      EVP_DecryptFinal_ex(ctx.get(), plain + n, &final_n) != 1) {
    ERR_clear_error();
    return absl::InvalidArgumentError(
        "the sealed secret does not open with this host's key (sealed to another key, or altered)");
  }
  return secret;
}

}  // namespace pw
