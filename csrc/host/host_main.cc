#include "csrc/host/host_main.h"

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
#include "csrc/coordination/host_channel.h"
#include "csrc/coordination/host_server.h"
#include "csrc/host/host_runtime.h"

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

}  // namespace

absl::StatusOr<HostMainOptions> ParseHostArgs(const std::vector<std::string>& args) {
  HostMainOptions options;
  for (const std::string& arg : args) {
    if (absl::StartsWith(arg, "--listen=")) {
      options.listen = arg.substr(9);
    } else if (arg == "--secret-stdin") {
      options.secret_from_stdin = true;
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
          "' (usage: pathways-host [--listen=ADDRESS:PORT] [--secret-stdin] [--stay] [--configure-timeout=SECONDS] "
          "[--client=ADDRESS])"));
    }
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
  } else if (const char* env = std::getenv("PATHWAYS_SECRET"); env != nullptr) {
    secret = env;
  }
  if (secret.empty()) {
    std::cerr << "pathways-host: no secret: pass --secret-stdin or set PATHWAYS_SECRET\n";
    return 2;
  }
  std::signal(SIGTERM, OnSignal);
  std::signal(SIGINT, OnSignal);

  // The data plane binds the IP the host listens on (loopback by default).
  std::string bind_ip = options.listen.substr(0, options.listen.rfind(':'));
  if (bind_ip.size() >= 2 && bind_ip.front() == '[') bind_ip = bind_ip.substr(1, bind_ip.size() - 2);
  if (bind_ip.empty() || bind_ip == "0.0.0.0" || bind_ip == "::") bind_ip = "127.0.0.1";
  HostRuntime::TestDelays delays;
  if (const char* env = std::getenv("PATHWAYS_HOST_TEST_DELAYS"); env != nullptr && *env != '\0') {
    auto parsed = HostRuntime::ParseTestDelays(env);
    if (!parsed.ok()) {
      std::cerr << "pathways-host: " << parsed.status().message() << "\n";
      return 2;
    }
    delays = *parsed;
  }
  HostRuntime runtime(secret, bind_ip, delays);
  auto server = HostServer::Start(options.listen, secret, &runtime);
  if (!server.ok()) {
    std::cerr << "pathways-host: " << server.status().message() << "\n";
    return 1;
  }
  std::cout << absl::StrFormat("pathways-host ready address=%s pid=%d incarnation=%016x", (*server)->address(),
                               getpid(), runtime.incarnation())
            << std::endl;
  if (!options.client.empty()) {
    bool sent = false;
    if (absl::Status registered = Register(options.client, secret, (*server)->address(),
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
    runtime.AwaitOwnerGone(50'000'000);
    if (g_signal != 0) {
      why = absl::StrCat("signal ", static_cast<int>(g_signal));
    } else if (g_stdin_closed.load()) {
      why = "its client's pipe closed";
    } else if (!options.stay && runtime.owner_gone()) {
      why = "its client's session ended";
    } else if (!options.stay && !runtime.configured() && NowNanos() - started > options.configure_timeout_ns) {
      why = "no client configured it in time";
    }
  }
  std::cerr << "pathways-host: stopping: " << why << "\n";
  server->reset();  // ends the open sessions
  return 0;
}

}  // namespace pw
