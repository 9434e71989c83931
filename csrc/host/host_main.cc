#include "csrc/host/host_main.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstdlib>
#include <iostream>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "csrc/base/spin.h"
#include "csrc/coordination/auth.h"
#include "csrc/coordination/host_channel.h"
#include "csrc/coordination/host_server.h"
#include "csrc/host/host_process.h"

namespace pw {
namespace {

volatile std::sig_atomic_t g_signal = 0;
void OnSignal(int signal) { g_signal = signal; }

// Reads stdin to its end on a thread of its own.
std::atomic<bool> g_stdin_closed{false};
void WatchStdin() {
  std::thread([] {
    char buf[256];
    while (true) {
      const ssize_t n = read(STDIN_FILENO, buf, sizeof(buf));
      if (n == 0 || (n < 0 && errno != EINTR)) break;
    }
    g_stdin_closed.store(true);
  }).detach();
}

// --sealed-secret-stdin: prints a fresh public key, reads the secret sealed
// to it (hex, one line) from stdin, and opens it.
absl::StatusOr<std::string> ReadSealedSecret() {
  absl::StatusOr<std::unique_ptr<SecretUnsealer>> unsealer = SecretUnsealer::Create();
  if (!unsealer.ok()) return unsealer.status();
  std::cout << "pathways-host sealing-key=" << ToHex((*unsealer)->public_key()) << std::endl;
  std::string line;
  if (!std::getline(std::cin, line)) return absl::InvalidArgumentError("stdin ended before the sealed secret");
  absl::StatusOr<std::string> sealed = FromHex(line);
  if (!sealed.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("the sealed secret is not hex: ", sealed.status().message()));
  }
  absl::StatusOr<std::string> secret = (*unsealer)->Open(*sealed);
  if (secret.ok() && secret->empty()) return absl::InvalidArgumentError("the sealed secret is empty");
  return secret;
}

// hosts=external: tells the client at `client` where this host listens.
// `*sent` says whether the registration left: if its reply then fails, the
// client may have it all the same.
absl::Status Register(const std::string& client, const std::string& secret, const std::string& address,
                      int64_t deadline_ns, bool* sent) {
  *sent = false;
  ChannelOptions options;
  options.secret = secret;
  options.host_name = absl::StrCat("the client (", client, ")");
  options.client_name = "pathways-host";
  options.heartbeat_period_ns = 0;
  // The client may not listen yet (Slurm starts everything at once): try
  // again until the deadline.
  absl::StatusOr<std::unique_ptr<HostChannel>> channel;
  while (true) {
    channel = HostChannel::Connect(client, wire::Hello(), options);
    if (channel.ok() || !absl::IsUnavailable(channel.status()) || NowNanos() >= deadline_ns) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  if (!channel.ok()) return channel.status();
  wire::Request request;
  request.mutable_register_host()->set_address(address);
  request.mutable_register_host()->set_pid(getpid());
  *sent = true;
  return (*channel)->Call(std::move(request), int64_t{10} * 1'000'000'000).status();
}

// "ip" of "ip:port" or "[ip]:port" (brackets dropped).
std::string HostPart(const std::string& address) {
  std::string host = address.substr(0, address.rfind(':'));
  if (host.size() >= 2 && host.front() == '[') host = host.substr(1, host.size() - 2);
  return host;
}

bool IsWildcard(const std::string& ip) { return ip.empty() || ip == "0.0.0.0" || ip == "::"; }

// The local IP this machine would send from to reach `address` (a UDP
// socket's connect picks the route and sends nothing).
absl::StatusOr<std::string> LocalIpToward(const std::string& address) {
  const std::string host = HostPart(address);
  addrinfo hints{};
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  if (getaddrinfo(host.c_str(), "9", &hints, &found) != 0 || found == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("cannot resolve '", host, "'"));
  }
  absl::StatusOr<std::string> ip = absl::UnavailableError(absl::StrCat("no route to '", host, "'"));
  const int fd = socket(found->ai_family, SOCK_DGRAM, 0);
  sockaddr_storage local{};
  socklen_t len = sizeof local;
  char text[INET6_ADDRSTRLEN] = {};
  if (fd >= 0 && connect(fd, found->ai_addr, found->ai_addrlen) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0) {
    const void* raw = local.ss_family == AF_INET6
                          ? static_cast<const void*>(&reinterpret_cast<sockaddr_in6*>(&local)->sin6_addr)
                          : static_cast<const void*>(&reinterpret_cast<sockaddr_in*>(&local)->sin_addr);
    if (inet_ntop(local.ss_family, raw, text, sizeof text) != nullptr) ip = std::string(text);
  }
  if (fd >= 0) close(fd);
  freeaddrinfo(found);
  return ip;
}

}  // namespace

absl::StatusOr<std::string> AdvertisedIp(const HostMainOptions& options) {
  const std::string listen_ip = HostPart(options.listen);
  if (!IsWildcard(listen_ip)) {
    if (!options.advertise.empty() && options.advertise != listen_ip) {
      return absl::InvalidArgumentError(absl::StrCat("--advertise=", options.advertise, " differs from the IP of --listen=",
                                                     options.listen, " (give --advertise only with a wildcard listen)"));
    }
    return listen_ip;
  }
  if (!options.advertise.empty()) {
    if (IsWildcard(options.advertise)) {
      return absl::InvalidArgumentError(absl::StrCat("--advertise=", options.advertise, " is not an address others can reach"));
    }
    return options.advertise;
  }
  if (!options.client.empty()) return LocalIpToward(options.client);
  return absl::InvalidArgumentError(absl::StrCat(
      "--listen=", options.listen, " listens on every interface: give --advertise=IP (the address the client and ",
      "the other hosts reach this host at), or --client=ADDRESS to advertise the IP that reaches the client"));
}

absl::StatusOr<HostMainOptions> ParseHostArgs(const std::vector<std::string>& args) {
  HostMainOptions options;
  for (const std::string& arg : args) {
    if (absl::StartsWith(arg, "--listen=")) {
      options.listen = arg.substr(9);
    } else if (arg == "--secret-stdin") {
      options.secret_from_stdin = true;
    } else if (arg == "--sealed-secret-stdin") {
      options.sealed_secret_from_stdin = true;
    } else if (absl::StartsWith(arg, "--advertise=") && arg.size() > 12) {
      options.advertise = arg.substr(12);
    } else if (absl::StartsWith(arg, "--client=") && arg.size() > 9) {
      options.client = arg.substr(9);
    } else if (arg == "--stay") {
      options.stay = true;
    } else if (absl::StartsWith(arg, "--configure-timeout=")) {
      double seconds = 0;
      if (!absl::SimpleAtod(arg.substr(20), &seconds) || !(seconds > 0) || seconds > 86400) {
        return absl::InvalidArgumentError(
            absl::StrCat("--configure-timeout must be a number of seconds in (0, 86400], got '", arg.substr(20), "'"));
      }
      options.configure_timeout_ns = static_cast<int64_t>(seconds * 1e9);
    } else {
      return absl::InvalidArgumentError(absl::StrCat(
          "unknown argument '", arg,
          "' (usage: pathways-host [--listen=ADDRESS:PORT] [--advertise=IP] [--secret-stdin | "
          "--sealed-secret-stdin] [--stay] [--configure-timeout=SECONDS] [--client=ADDRESS])"));
    }
  }
  if (options.secret_from_stdin && options.sealed_secret_from_stdin) {
    return absl::InvalidArgumentError("--secret-stdin and --sealed-secret-stdin exclude each other");
  }
  return options;
}

int RunHost(const HostMainOptions& options) {
  std::string secret;
  if (options.secret_from_stdin) {
    if (!std::getline(std::cin, secret)) {
      std::cerr << "pathways-host: --secret-stdin: stdin ended before the secret\n";
      return 2;
    }
    WatchStdin();
  } else if (options.sealed_secret_from_stdin) {
    absl::StatusOr<std::string> opened = ReadSealedSecret();
    if (!opened.ok()) {
      std::cerr << "pathways-host: --sealed-secret-stdin: " << opened.status().message() << "\n";
      return 2;
    }
    secret = *std::move(opened);
    WatchStdin();
  } else if (const char* env = std::getenv("PATHWAYS_SECRET"); env != nullptr) {
    secret = env;
  }
  if (secret.empty()) {
    std::cerr << "pathways-host: no secret: pass --secret-stdin or set PATHWAYS_SECRET\n";
    return 2;
  }
  std::signal(SIGTERM, OnSignal);
  std::signal(SIGINT, OnSignal);

  // The data plane and Gloo bind the IP the host is reached at: the one
  // it listens on, or with a wildcard listen the advertised one.
  const absl::StatusOr<std::string> bind_ip = AdvertisedIp(options);
  if (!bind_ip.ok()) {
    std::cerr << "pathways-host: " << bind_ip.status().message() << "\n";
    return 2;
  }
  HostProcess::TestDelays delays;
  if (const char* env = std::getenv("PATHWAYS_HOST_TEST_DELAYS"); env != nullptr && *env != '\0') {
    auto parsed = HostProcess::ParseTestDelays(env);
    if (!parsed.ok()) {
      std::cerr << "pathways-host: " << parsed.status().message() << "\n";
      return 2;
    }
    delays = *parsed;
  }
  HostProcess process(secret, *bind_ip, delays);
  // Plaintext only where the others reach this host on loopback.
  ServerOptions server_options;
  server_options.transport = IsLoopbackAddress(absl::StrCat(*bind_ip, ":0")) ? Transport::kPlaintext : Transport::kTls;
  auto server = HostServer::Start(options.listen, secret, &process, server_options);
  if (!server.ok()) {
    std::cerr << "pathways-host: " << server.status().message() << "\n";
    return 1;
  }
  // What the client dials: the advertised IP, with the port listened on.
  const std::string& listening = (*server)->address();
  const std::string port = listening.substr(listening.rfind(':') + 1);
  const std::string address = absl::StrContains(*bind_ip, ':') ? absl::StrCat("[", *bind_ip, "]:", port)
                                                                 : absl::StrCat(*bind_ip, ":", port);
  std::cout << absl::StrFormat("pathways-host ready address=%s pid=%d incarnation=%016x", address, getpid(),
                               process.incarnation())
            << std::endl;
  if (!options.client.empty()) {
    bool sent = false;
    if (absl::Status registered = Register(options.client, secret, address,
                                           NowNanos() + options.configure_timeout_ns, &sent);
        !registered.ok()) {
      std::cerr << "pathways-host: registering with the client at " << options.client
                << " failed: " << registered.message() << "\n";
      // A refusal is final. A reply lost after the registration left (the
      // client may be busy connecting to its hosts) is not: the client may
      // have it, so wait to be configured, as long as an unregistered
      // host would.
      if (!sent || absl::IsUnauthenticated(registered) || absl::IsPermissionDenied(registered) ||
          absl::IsInvalidArgument(registered)) {
        return 1;
      }
    }
  }

  const int64_t started = NowNanos();
  std::string why;
  while (why.empty()) {
    process.AwaitOwnerGone(50'000'000);
    if (g_signal != 0) {
      why = absl::StrCat("signal ", static_cast<int>(g_signal));
    } else if (g_stdin_closed.load()) {
      why = "its client's pipe closed";
    } else if (!options.stay && process.owner_gone()) {
      why = "its client's session ended";
    } else if (!options.stay && !process.configured() && NowNanos() - started > options.configure_timeout_ns) {
      why = "no client configured it in time";
    }
  }
  std::cerr << "pathways-host: stopping: " << why << "\n";
  server->reset();  // ends the open sessions
  return 0;
}

}  // namespace pw
