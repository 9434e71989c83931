#include "csrc/codegen/native_compiler.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "csrc/base/background_thread.h"

extern char** environ;

namespace pw::codegen {
namespace {

// Flags of every compile. No -ffast-math and no contraction into fused
// multiply-adds: the generated code must round each op as the interpreter
// does (fused_region.h).
const char* const kFlags[] = {"-O3", "-march=native", "-std=c++20", "-ffp-contract=off",
                              "-fPIC", "-shared", "-w"};

std::string Getenv(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr ? std::string() : std::string(v);
}

bool IsExecutable(const std::string& path) { return access(path.c_str(), X_OK) == 0; }

// `name` on PATH (or `name` itself if it has a slash and is executable).
std::string FindProgram(const std::string& name) {
  if (name.find('/') != std::string::npos) return IsExecutable(name) ? name : std::string();
  for (absl::string_view dir : absl::StrSplit(Getenv("PATH"), ':', absl::SkipEmpty())) {
    std::string p = absl::StrCat(dir, "/", name);
    if (IsExecutable(p)) return p;
  }
  return std::string();
}

absl::Status MakeDirs(const std::string& dir) {
  std::string path;
  for (absl::string_view part : absl::StrSplit(dir, '/')) {
    absl::StrAppend(&path, part, "/");
    if (part.empty()) continue;
    if (mkdir(path.c_str(), 0755) != 0 && errno != EEXIST) {
      return absl::FailedPreconditionError(
          absl::StrCat("cannot create the kernel cache directory ", path, ": ", std::strerror(errno)));
    }
  }
  return absl::OkStatus();
}

// Runs argv, its stderr into `log`; the exit status.
absl::StatusOr<int> Run(const std::vector<std::string>& argv, const std::string& log) {
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 2, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0);
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid;
  const int rc = posix_spawn(&pid, args[0], &actions, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot start the compiler ", argv[0], ": ", std::strerror(rc)));
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) return absl::InternalError("waitpid failed");
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

std::string ReadHead(const std::string& path, size_t limit) {
  std::ifstream in(path);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (text.size() > limit) text.resize(limit);
  return text;
}

std::atomic<uint64_t> temp_counter{0};

}  // namespace

NativeLibrary::~NativeLibrary() {
  if (handle_ != nullptr) dlclose(handle_);
}

NativeOptions NativeOptions::FromEnvironment() {
  NativeOptions o;
  const std::string flag = Getenv("PATHWAYS_NATIVE_KERNELS");
  o.enabled = !(flag == "0" || flag == "false" || flag == "off");
  o.compiler = Getenv("PATHWAYS_CXX");
  const std::string after = Getenv("PATHWAYS_NATIVE_AFTER_RUNS");
  if (!after.empty()) o.after_runs = std::max<int64_t>(0, std::atoll(after.c_str()));
  o.cache_dir = Getenv("PATHWAYS_KERNEL_CACHE");
  if (o.cache_dir.empty()) {
    const std::string xdg = Getenv("XDG_CACHE_HOME");
    const std::string home = Getenv("HOME");
    o.cache_dir = !xdg.empty()    ? xdg + "/pathways/kernels"
                  : !home.empty() ? home + "/.cache/pathways/kernels"
                                  : "/tmp/pathways-kernels";
  }
  return o;
}

NativeCompiler::NativeCompiler(NativeOptions options) : options_(std::move(options)) {
  for (const char* f : kFlags) flags_.push_back(f);
}

NativeCompiler::~NativeCompiler() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

NativeCompiler& NativeCompiler::Default() {
  static NativeCompiler* const compiler = new NativeCompiler(NativeOptions::FromEnvironment());
  return *compiler;
}

const std::string& NativeCompiler::CompilerPath() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!compiler_looked_up_) {
    compiler_looked_up_ = true;
    if (!options_.compiler.empty()) {
      compiler_path_ = FindProgram(options_.compiler);
    } else {
      for (const char* name : {"c++", "g++", "clang++"}) {
        compiler_path_ = FindProgram(name);
        if (!compiler_path_.empty()) break;
      }
    }
    if (compiler_path_.empty()) {
      std::fprintf(stderr,
                   "pathways: no C++ compiler (%s); fused loops run in the interpreter "
                   "(set PATHWAYS_CXX, or PATHWAYS_NATIVE_KERNELS=0 to silence this)\n",
                   options_.compiler.empty() ? "looked for c++, g++, clang++ on PATH"
                                             : options_.compiler.c_str());
    }
  }
  return compiler_path_;
}

uint64_t NativeCompiler::KeyOf(const std::string& source) const {
  uint64_t h = 1469598103934665603ull;
  auto mix = [&](absl::string_view s) {
    for (unsigned char c : s) {
      h ^= c;
      h *= 1099511628211ull;
    }
    h ^= 0xff;
    h *= 1099511628211ull;
  };
  mix(source);
  mix(options_.compiler);
  for (const std::string& f : flags_) mix(f);
  mix(absl::StrCat(kNativeAbiVersion));
  return h;
}

absl::StatusOr<std::shared_ptr<const NativeLibrary>> NativeCompiler::Load(const std::string& path,
                                                                          uint64_t key,
                                                                          int num_regions) {
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* err = dlerror();
    return absl::DataLossError(absl::StrCat("cannot load ", path, ": ", err ? err : "?"));
  }
  std::shared_ptr<NativeLibrary> lib(new NativeLibrary());
  lib->handle_ = handle;
  auto abi = reinterpret_cast<int (*)()>(dlsym(handle, "pw_native_abi"));
  auto hash = reinterpret_cast<uint64_t (*)()>(dlsym(handle, "pw_native_source_hash"));
  if (abi == nullptr || hash == nullptr || abi() != kNativeAbiVersion || hash() != key) {
    return absl::DataLossError(absl::StrCat(path, " was built from another source or ABI"));
  }
  for (int k = 0; k < num_regions; ++k) {
    auto fn = reinterpret_cast<PwRegionFn>(dlsym(handle, absl::StrCat("pw_region_", k).c_str()));
    if (fn == nullptr) return absl::DataLossError(absl::StrCat(path, " lacks pw_region_", k));
    lib->regions_.push_back(fn);
  }
  return std::shared_ptr<const NativeLibrary>(std::move(lib));
}

absl::StatusOr<std::shared_ptr<const NativeLibrary>> NativeCompiler::Compile(
    const std::string& source, int num_regions) {
  auto count = [&](int64_t Stats::*field) {
    std::lock_guard<std::mutex> lock(mu_);
    ++(stats_.*field);
  };
  auto fail = [&](absl::Status status) {
    count(&Stats::failed);
    return status;
  };
  if (!options_.enabled) {
    return fail(absl::FailedPreconditionError("native kernels are off (PATHWAYS_NATIVE_KERNELS=0)"));
  }
  const uint64_t key = KeyOf(source);
  const std::string stem = absl::StrFormat("%s/%016x", options_.cache_dir, key);
  const std::string so = stem + ".so";
  bool stale = false;
  if (access(so.c_str(), F_OK) == 0) {
    auto lib = Load(so, key, num_regions);
    if (lib.ok()) {
      count(&Stats::cache_hits);
      return lib;
    }
    stale = true;  // truncated, corrupted, or another source's: build it again
  }
  const std::string& compiler = CompilerPath();
  if (compiler.empty()) return fail(absl::FailedPreconditionError("no C++ compiler"));
  if (absl::Status s = MakeDirs(options_.cache_dir); !s.ok()) return fail(s);
  // Written under a name of this process's, then renamed into place, so a
  // reader never sees half a file and concurrent processes agree.
  const std::string tmp = absl::StrFormat("%s.%d.%d", stem, getpid(), temp_counter.fetch_add(1));
  const std::string full_source =
      absl::StrFormat("%s\nextern \"C\" uint64_t pw_native_source_hash() { return 0x%016xull; }\n",
                      source, key);
  {
    std::ofstream out(tmp + ".cc");
    out << full_source;
    if (!out) return fail(absl::FailedPreconditionError(absl::StrCat("cannot write ", tmp, ".cc")));
  }
  std::vector<std::string> argv = {compiler};
  argv.insert(argv.end(), flags_.begin(), flags_.end());
  argv.insert(argv.end(), {"-o", tmp + ".so", tmp + ".cc"});
  auto rc = Run(argv, tmp + ".log");
  if (!rc.ok() || *rc != 0) {
    std::string why = rc.ok() ? ReadHead(tmp + ".log", 2000) : std::string(rc.status().message());
    std::remove((tmp + ".so").c_str());
    // The source and the log stay beside the cache for whoever debugs it.
    std::rename((tmp + ".cc").c_str(), (stem + ".failed.cc").c_str());
    std::rename((tmp + ".log").c_str(), (stem + ".failed.log").c_str());
    return fail(absl::InternalError(absl::StrCat("compiling ", stem, ".failed.cc failed: ", why)));
  }
  std::remove((tmp + ".log").c_str());
  std::rename((tmp + ".cc").c_str(), (stem + ".cc").c_str());
  if (std::rename((tmp + ".so").c_str(), so.c_str()) != 0) {
    return fail(absl::FailedPreconditionError(absl::StrCat("cannot write ", so)));
  }
  auto lib = Load(so, key, num_regions);
  if (!lib.ok()) return fail(lib.status());
  count(stale ? &Stats::rebuilt : &Stats::compiled);
  return lib;
}

void NativeCompiler::Register(const std::shared_ptr<NativeJob>& job) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    jobs_.push_back(job);
    if (!thread_.joinable()) thread_ = std::thread([this] { Loop(); });
  }
  cv_.notify_all();
}

std::shared_ptr<NativeJob> NativeCompiler::NextDue() {
  std::shared_ptr<NativeJob> due;
  size_t kept = 0;
  for (size_t i = 0; i < jobs_.size(); ++i) {
    std::shared_ptr<NativeJob> job = jobs_[i].lock();
    if (job == nullptr || job->state.load() != NativeJob::kWaiting) continue;  // dropped
    if (due == nullptr && job->runs.load(std::memory_order_relaxed) >= options_.after_runs) {
      due = job;
      continue;  // taken
    }
    jobs_[kept++] = jobs_[i];
  }
  jobs_.resize(kept);
  return due;
}

void NativeCompiler::Loop() {
  MarkBackgroundThread();
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    if (stop_) return;
    std::shared_ptr<NativeJob> job = NextDue();
    if (job == nullptr) {
      // Runs are counted without telling anyone: look again shortly.
      cv_.wait_for(lock, std::chrono::milliseconds(10));
      continue;
    }
    job->state.store(NativeJob::kCompiling);
    busy_ = true;
    lock.unlock();
    auto lib = Compile(job->source, job->num_regions);
    if (lib.ok()) {
      job->library = *lib;
      job->regions.store(job->library->regions().data(), std::memory_order_release);
      job->state.store(NativeJob::kReady);
    } else {
      job->state.store(NativeJob::kFailed);
    }
    lock.lock();
    busy_ = false;
    cv_.notify_all();
  }
}

void NativeCompiler::WaitIdle() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    if (stop_ || thread_.get_id() == std::this_thread::get_id()) return;
    bool due = busy_;
    for (const auto& w : jobs_) {
      std::shared_ptr<NativeJob> job = w.lock();
      if (job != nullptr && job->state.load() == NativeJob::kWaiting &&
          job->runs.load(std::memory_order_relaxed) >= options_.after_runs) {
        due = true;
      }
    }
    if (!due) return;
    cv_.wait_for(lock, std::chrono::milliseconds(10));
  }
}

NativeCompiler::Stats NativeCompiler::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

}  // namespace pw::codegen
