#ifndef PATHWAYS_HOST_HOST_MAIN_H_
#define PATHWAYS_HOST_HOST_MAIN_H_

// The entry point of a host process: `pathways-host` and
// `python -m pathways.host` both run RunHost().
//
//   pathways-host [--listen=127.0.0.1:0] [--advertise=IP]
//                 [--secret-stdin | --sealed-secret-stdin]
//                 [--stay] [--configure-timeout=SECONDS] [--client=ADDRESS]
//
// The host listens (port 0: a free port), prints one line to stdout,
//   pathways-host ready address=127.0.0.1:40123 pid=4242 incarnation=9f3c...
// and serves until it is told to stop:
//   - SIGTERM or SIGINT;
//   - with --secret-stdin (how a client starts its hosts), the secret is the
//     first line of stdin, and the end of stdin (the client died or closed
//     the pipe) stops the host: a host never outlives the client that
//     started it, however that client ended;
//   - unless --stay, the end of the session of the client that configured
//     it, or no client configuring it within --configure-timeout (60 s).
// With --sealed-secret-stdin (hosts="ray": the secret must not pass through
// Ray) the host first prints
//   pathways-host sealing-key=<64 hex digits>
// (a fresh X25519 public key, auth.h) and reads the secret sealed to that
// key, in hex, as the first line of stdin; only this process can open it.
// Then it goes on as with --secret-stdin.
// Without either the secret comes from the environment variable
// PATHWAYS_SECRET (hosts started by hand, by Slurm or Kubernetes).
// The control plane is plaintext if the advertised IP is on loopback, TLS
// otherwise (host_server.h); either way a session proves it knows the
// secret without sending it. With
// --client=ADDRESS the host registers with a client waiting there
// (hosts=external) once it listens. The host's data plane and Gloo bind the
// IP address it listens on; a wildcard listen (0.0.0.0, ::) needs the IP to
// advertise: --advertise=IP, or with --client the IP that reaches the client.
// For tests only, PATHWAYS_HOST_TEST_DELAYS
// ("load_function=SECONDS,put=SECONDS") makes the host slow at its work
// (see HostTestDelays in host_process.h); a value it cannot read stops it
// with exit code 2.

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace pw {

struct HostMainOptions {
  std::string listen = "127.0.0.1:0";
  bool secret_from_stdin = false;
  bool sealed_secret_from_stdin = false;
  bool stay = false;
  int64_t configure_timeout_ns = int64_t{60} * 1'000'000'000;
  std::string client;  // --client: register with the client there
  // --advertise: the IP the client and the other hosts reach this host at,
  // for a wildcard --listen (0.0.0.0 or ::), which has none to give.
  std::string advertise;
};

// The IP this host gives the client and the other hosts (and binds its data
// plane and collectives to): the IP of --listen; with a wildcard listen,
// --advertise, else (with --client) the local IP that reaches the client.
// InvalidArgument if there is none (a wildcard listen with neither flag), or
// --advertise contradicts --listen.
absl::StatusOr<std::string> AdvertisedIp(const HostMainOptions& options);

// InvalidArgument naming the flag for anything it does not understand.
absl::StatusOr<HostMainOptions> ParseHostArgs(const std::vector<std::string>& args);

// Serves until told to stop (see above); the process's exit code. Prints
// errors to stderr. Call once per process: it installs signal handlers.
int RunHost(const HostMainOptions& options);

}  // namespace pw

#endif  // PATHWAYS_HOST_HOST_MAIN_H_
