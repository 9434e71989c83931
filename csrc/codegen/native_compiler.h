#ifndef PATHWAYS_CODEGEN_NATIVE_COMPILER_H_
#define PATHWAYS_CODEGEN_NATIVE_COMPILER_H_

// Turns generated C++ (fused_region.h) into code this process can call: the
// system's C++ compiler makes a shared library, cached on disk by a hash of
// the source, the compiler and its flags (as PyTorch Inductor's CPU backend
// does), and dlopen loads it. Measured against LLVM's ORC JIT in
// benchmarks/native_compile.py: see the README's "Native kernels".
//
// Tiered, as a JIT is: a function starts in the interpreter, and once it has
// run PATHWAYS_NATIVE_AFTER_RUNS times (default 2: a function called once,
// as most of a test suite's are, never costs a compile) its native code is
// compiled on one background thread of the compiler's and swapped in when
// it is ready; the disk cache makes a second process start native at the
// threshold without compiling. A cache entry
// that does not load (truncated, corrupted) or that was built from another
// source or ABI (a hash collision, an older runtime) is rebuilt.
//
// Environment (read once, by Default()):
//   PATHWAYS_NATIVE_KERNELS=0   never compile (the interpreter only);
//   PATHWAYS_NATIVE_AFTER_RUNS  runs before a function is compiled (0: at once);
//   PATHWAYS_CXX                the compiler (default: c++, g++, clang++ on PATH);
//   PATHWAYS_KERNEL_CACHE       the cache directory (default:
//                               $XDG_CACHE_HOME/pathways/kernels or
//                               ~/.cache/pathways/kernels).
// With no compiler, the first compile prints one line to stderr and every
// compile fails with FailedPrecondition: the interpreter runs everything.
//
// Thread-safe.

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "csrc/codegen/native_abi.h"

namespace pw::codegen {

// A loaded library of regions. Never unloaded while a reference exists (the
// executables that call its functions hold one).
class NativeLibrary {
 public:
  ~NativeLibrary();
  NativeLibrary(const NativeLibrary&) = delete;
  NativeLibrary& operator=(const NativeLibrary&) = delete;
  // pw_region_<k>, for k < num_regions().
  absl::Span<const PwRegionFn> regions() const { return regions_; }

 private:
  friend class NativeCompiler;
  NativeLibrary() = default;
  void* handle_ = nullptr;
  std::vector<PwRegionFn> regions_;
};

struct NativeOptions {
  bool enabled = true;
  int64_t after_runs = 2;
  std::string compiler;   // a path or a name looked up on PATH; empty: the default list
  std::string cache_dir;  // created if missing
  // Read from the environment, as documented above.
  static NativeOptions FromEnvironment();
};

// One function's native code, registered by its executable at compile time
// and shared with the compiler's thread. The executable counts its runs
// (`runs`, relaxed: no lock, no allocation on an executor thread) and reads
// `regions` (acquire): null until the library is loaded.
struct NativeJob {
  std::string source;
  int num_regions = 0;
  std::atomic<int64_t> runs{0};
  std::atomic<const PwRegionFn*> regions{nullptr};
  // Set by the compiler's thread before `regions`; then read-only.
  std::shared_ptr<const NativeLibrary> library;
  enum State : int { kWaiting, kCompiling, kReady, kFailed };
  std::atomic<int> state{kWaiting};
};

class NativeCompiler {
 public:

  explicit NativeCompiler(NativeOptions options);
  ~NativeCompiler();  // waits for the compile in progress; the rest stay uncompiled
  NativeCompiler(const NativeCompiler&) = delete;
  NativeCompiler& operator=(const NativeCompiler&) = delete;

  // The process's compiler, with options from the environment. Never
  // destroyed.
  static NativeCompiler& Default();

  bool enabled() const { return options_.enabled; }
  const NativeOptions& options() const { return options_; }

  // Takes `job` (its source EmitNativeSource's, defining pw_region_0 ..
  // pw_region_<num_regions - 1>): compiled on the compiler's thread once its
  // runs reach options().after_runs. The compiler holds it weakly: a job
  // whose executable is gone is dropped.
  void Register(const std::shared_ptr<NativeJob>& job);
  // Compiles `source` on this thread (or loads it from the cache).
  absl::StatusOr<std::shared_ptr<const NativeLibrary>> Compile(const std::string& source,
                                                               int num_regions);
  // Blocks until no registered job has reached its threshold without being
  // compiled (its library loaded, or its compile failed).
  void WaitIdle();

  struct Stats {
    int64_t compiled = 0;    // built by the compiler
    int64_t cache_hits = 0;  // loaded from the disk cache
    int64_t rebuilt = 0;     // cache entries that did not load, built again
    int64_t failed = 0;      // compiles that gave no library
  };
  Stats stats() const;

  // The cache key of a source: a 64-bit FNV-1a hash of it, the compiler
  // command and the ABI version.
  uint64_t KeyOf(const std::string& source) const;

 private:
  void Loop();
  // A job due for compiling, or null; drops the dead ones. Under mu_.
  std::shared_ptr<NativeJob> NextDue();
  // The compiler's path, found once; empty if there is none.
  const std::string& CompilerPath();
  absl::StatusOr<std::shared_ptr<const NativeLibrary>> Load(const std::string& path, uint64_t key,
                                                            int num_regions);

  const NativeOptions options_;
  std::vector<std::string> flags_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::weak_ptr<NativeJob>> jobs_;
  bool busy_ = false;
  bool stop_ = false;
  Stats stats_;
  bool compiler_looked_up_ = false;
  std::string compiler_path_;
  std::thread thread_;  // started by the first Register
};

}  // namespace pw::codegen

#endif  // PATHWAYS_CODEGEN_NATIVE_COMPILER_H_
