#ifndef PATHWAYS_COORDINATION_AUTH_H_
#define PATHWAYS_COORDINATION_AUTH_H_

// The cryptography of the control plane (host_channel.h, host_server.h) and
// the data plane (data_plane.h), on OpenSSL's libcrypto (the library gRPC
// links on Debian): random bytes, SHA-256, HMAC-SHA256, the proofs of the
// challenge-response both planes authenticate with, a self-signed TLS
// identity for a control plane that listens beyond loopback, and sealing a
// secret to a host's public key (hosts="ray"). Nothing here is hand-written
// cryptography: every primitive is OpenSSL's.
//
// The challenge-response (both planes; the same proofs, told apart by the
// plane's name):
//   1. the dialer sends a fresh 32-byte nonce Nd, and whom it claims to be:
//      "the cluster" (it knows the cluster's secret), host h (it knows the
//      key the client gave host h for this listener, see peer keys below),
//      or tenant t of a service (it knows the key the service gave the
//      hosts for that tenant: its bulk data goes to the hosts directly,
//      service/service.h);
//   2. the listener answers with its own fresh nonce Nl;
//   3. the dialer proves it knows the key K of its claim:
//      HMAC-SHA256(K, "pathways-auth-v1" | plane | "dialer" | transcript);
//   4. the listener checks it (in constant time) and only then proves its
//      own knowledge: the same with "listener".
// The transcript holds both nonces, the claim, the listener's host id (data
// plane) and the channel binding: the SHA-256 of the TLS certificate the
// listener presented (empty without TLS). Every field is length-prefixed,
// so no two transcripts encode alike. So:
//   - the key never crosses the wire; an observer sees nonces and MACs;
//   - a recorded proof is worthless later: the other side's nonce is fresh;
//   - a proof for one plane, direction, claim or listener is no proof for
//     another (a dialer's proof cannot be reflected back as the listener's);
//   - with TLS, a man in the middle who terminates TLS with a certificate of
//     its own is caught: the two ends bind different certificates, so the
//     listener refuses the dialer's proof and the dialer the listener's;
//   - the dialer proves first, so a stranger who connects to a host learns
//     nothing it could test guesses of the key against; only a fake
//     listener that a dialer was sent to gets one proof to attack offline.
//     Use a secret of full strength (pathways makes 256 random bits).
// Without TLS (loopback only, see host_server.h) an attacker who can inject
// into a live TCP connection could still take it over after the handshake;
// on loopback that takes root on the machine, who can read the secret from
// memory anyway.
//
// Peer keys: the client gives every pair of hosts {a, b} a key of their own
// (random, 32 bytes; JoinCluster), and each host only its row. Host a proves
// it is host a to host b with K_ab, which no third host knows: a host that
// is taken over can speak for itself only, not for the other hosts (the
// rendezvous store's scopes rest on that, host_process.h).

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace pw {

inline constexpr size_t kNonceBytes = 32;
inline constexpr size_t kProofBytes = 32;  // HMAC-SHA256
inline constexpr size_t kPeerKeyBytes = 32;

// `n` bytes from OpenSSL's CSPRNG; Internal if it cannot give them.
absl::StatusOr<std::string> RandomBytes(size_t n);

std::string Sha256(absl::string_view data);
std::string HmacSha256(absl::string_view key, absl::string_view data);

// Whether `a` and `b` are equal, in time that depends only on their lengths.
bool ConstantTimeEquals(absl::string_view a, absl::string_view b);

// Lower-case hex, and back (InvalidArgument for anything but an even
// number of hex digits).
std::string ToHex(absl::string_view bytes);
absl::StatusOr<std::string> FromHex(absl::string_view hex);

// What a handshake's proofs cover (see above).
struct HandshakeTranscript {
  std::string plane;       // "control" or "data"
  // The dialer's claim: a host id, -1 for the cluster, or TenantClaim(t).
  int64_t claim = -1;
  int64_t listener = -1;   // the listener's host id where it has one (data plane), else -1
  std::string dialer_nonce;
  std::string listener_nonce;
  std::string binding;     // SHA-256 of the listener's TLS certificate (DER), or empty
};

enum class ProofBy { kDialer, kListener };

// The dialer's opening of a control plane session (step 1 above), as the
// session's metadata carries it: its nonce in hex (pw-auth-nonce) and its
// claim (pw-auth-claim), "cluster", a host id (decimal) or "tenant-<t>"
// (t >= 1, decimal). What a host reads of a session before the dialer
// proved anything: Unauthenticated, saying what is wrong, unless the nonce
// is kNonceBytes in hex and the claim one of those.
struct SessionOpening {
  std::string nonce;   // kNonceBytes
  int64_t claim = -1;  // a host id (>= 0), -1 for the cluster, or TenantClaim(t) (<= -2)
};
// A service's tenant t (>= 1) as a claim, and back (0 for a claim of no tenant).
inline int64_t TenantClaim(uint64_t tenant) { return -1 - static_cast<int64_t>(tenant); }
inline uint64_t ClaimedTenant(int64_t claim) { return claim <= -2 ? static_cast<uint64_t>(-1 - claim) : 0; }
// The largest tenant id a claim can carry.
inline constexpr uint64_t kMaxTenant = uint64_t{1} << 62;
absl::StatusOr<SessionOpening> ParseSessionOpening(absl::string_view nonce_hex, absl::string_view claim);

// HMAC-SHA256(key, "pathways-auth-v1" | plane | role | transcript), 32 bytes.
std::string HandshakeProof(absl::string_view key, ProofBy by, const HandshakeTranscript& transcript);

// Heartbeats (the control plane's Heartbeat rpc, on a connection of its
// own, host_channel.h): they carry no secret either. After a session's
// handshake both ends derive its heartbeat key
//   S = HMAC-SHA256(K, "pathways-heartbeat-v1" | transcript)
// (K and the transcript as for the proofs, so S is fresh per session and
// never crosses the wire). Each heartbeat names the session (the id the
// host gave in its proof), a counter that increases with every heartbeat,
// and the time it was sent, under
//   HMAC-SHA256(S, "ping" | session | counter | sent_ns);
// the host answers only a MAC that holds and a counter above the last one
// it answered for that session (so a recorded heartbeat is worthless), and
// MACs its answer, so no one else can keep a dead host looking alive:
//   HMAC-SHA256(S, "pong" | session | counter | sent_ns | incarnation | host_ns).
std::string HeartbeatKey(absl::string_view key, const HandshakeTranscript& transcript);
std::string HeartbeatPingMac(absl::string_view heartbeat_key, uint64_t session, uint64_t counter, uint64_t sent_ns);
std::string HeartbeatPongMac(absl::string_view heartbeat_key, uint64_t session, uint64_t counter, uint64_t sent_ns,
                             uint64_t incarnation, int64_t host_ns);

// A TLS identity made at start: an EC P-256 key and a self-signed
// certificate for it (CN "pathways-host", valid from an hour ago for ten
// years). Nobody needs to trust it beforehand: the handshake binds its
// fingerprint (above).
struct TlsIdentity {
  std::string private_key_pem;
  std::string certificate_pem;
  std::string certificate_sha256;  // of the certificate's DER encoding
};
absl::StatusOr<TlsIdentity> MakeSelfSignedTlsIdentity();

// SHA-256 of the DER encoding of the (first) certificate in `pem`;
// InvalidArgument if `pem` holds none.
absl::StatusOr<std::string> CertificateSha256(absl::string_view pem);

// Sealing a secret to one process (hosts="ray", see python/pathways/_ray_hosts.py):
// the host makes an X25519 key pair and publishes the public key; the
// client seals the secret to it (an ephemeral X25519 key agreement,
// HKDF-SHA256, AES-256-GCM); only the process holding the private key can
// open it, and anything that changed a byte of the sealed text (or sealed
// it to another key) fails to open. The private key never leaves memory.
inline constexpr size_t kSealingPublicKeyBytes = 32;
class SecretUnsealer {
 public:
  static absl::StatusOr<std::unique_ptr<SecretUnsealer>> Create();
  ~SecretUnsealer();
  SecretUnsealer(const SecretUnsealer&) = delete;
  SecretUnsealer& operator=(const SecretUnsealer&) = delete;

  // The raw 32-byte X25519 public key.
  const std::string& public_key() const { return public_key_; }
  // The secret SealSecret sealed to public_key(); InvalidArgument if
  // `sealed` is malformed, was sealed to another key, or was altered.
  absl::StatusOr<std::string> Open(absl::string_view sealed) const;

 private:
  struct Key;
  explicit SecretUnsealer(std::unique_ptr<Key> key, std::string public_key);
  std::unique_ptr<Key> key_;
  std::string public_key_;
};

// `secret` sealed to the X25519 `public_key` (32 raw bytes; InvalidArgument
// otherwise): 32 bytes of ephemeral public key, the ciphertext, a 16-byte tag.
absl::StatusOr<std::string> SealSecret(absl::string_view public_key, absl::string_view secret);

}  // namespace pw

#endif  // PATHWAYS_COORDINATION_AUTH_H_
