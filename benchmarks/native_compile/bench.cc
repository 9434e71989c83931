// The measuring program of benchmarks/native_compile.py (which builds it, runs
// it in fresh processes and prints the table). One run:
//
//   1. ORC (if --orc names orc_jit.so): dlopen it (loads libLLVM: timed),
//      pw_orc_create (the process's LLJIT: timed).
//   2. reps + 1 rounds; in each, every kernel by every path, interleaved:
//        system compiler: from the source string to a function pointer:
//          a new directory, write kernel.cc, `<cxx> -O3 -march=native -shared
//          -fPIC -o kernel.so kernel.cc` (posix_spawn, wait), dlopen, dlsym;
//        ORC: pw_orc_compile on the kernel's unoptimized IR text (read from
//          its file before the clock starts).
//      Round 0 is the first compile in the process, reported apart.
//   3. Warm disk-cache hits, `reps` times: hash the source, stat the cached
//      .so (one the first compiler built), dlopen, dlsym; closed after each,
//      so each dlopen maps and relocates it anew.
//   4. The kernels of the last round, every path: checked against a double
//      precision reference (rows x cols and a 7 x 1000 shape with a tail),
//      compared with each other, then timed (batches interleaved by path).
//
// Writes JSON to --out. Usage:
//   bench --out FILE --work DIR [--reps N] [--orc orc_jit.so]
//         [--rows R --cols C] [--batches B --batch-ms MS]
//         --cxx NAME=PATH ... --kernel NAME=SOURCE.cc[,IR.ll] ...
// NAME of a kernel: softmax, layernorm_gelu or empty (compiled, not run).
#include <dlfcn.h>
#include <fcntl.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

extern char** environ;

namespace {

using Clock = std::chrono::steady_clock;

double MsSince(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

// ---------------------------------------------------------------------------
// JSON output (just what this program writes).

std::string JsonString(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (c == '\n') {
      out += "\\n";
    } else if (static_cast<unsigned char>(c) < 0x20) {
      out += ' ';
    } else {
      out += c;
    }
  }
  return out + "\"";
}

std::string JsonNumber(double v) {
  if (!std::isfinite(v)) return "null";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.10g", v);
  return buf;
}

// An object built field by field: Obj().Num("a", 1).Str("b", "x").Text().
class Obj {
 public:
  Obj& Num(const std::string& k, double v) { return Raw(k, JsonNumber(v)); }
  Obj& Str(const std::string& k, const std::string& v) { return Raw(k, JsonString(v)); }
  Obj& Bool(const std::string& k, bool v) { return Raw(k, v ? "true" : "false"); }
  Obj& Raw(const std::string& k, const std::string& json) {
    body_ += (body_.empty() ? "" : ", ") + JsonString(k) + ": " + json;
    return *this;
  }
  std::string Text() const { return "{" + body_ + "}"; }

 private:
  std::string body_;
};

std::string JsonList(const std::vector<std::string>& items) {
  std::string out = "[";
  for (size_t i = 0; i < items.size(); ++i) out += (i ? ", " : "") + items[i];
  return out + "]";
}

std::string JsonNumbers(const std::vector<double>& v) {
  std::vector<std::string> items;
  for (double x : v) items.push_back(JsonNumber(x));
  return JsonList(items);
}

// ---------------------------------------------------------------------------
// Files and processes.

bool ReadFile(const std::string& path, std::string* out) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return false;
  std::ostringstream ss;
  ss << f.rdbuf();
  *out = ss.str();
  return true;
}

bool WriteFile(const std::string& path, const std::string& text) {
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) return false;
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = write(fd, text.data() + done, text.size() - done);
    if (n <= 0) break;
    done += static_cast<size_t>(n);
  }
  close(fd);
  return done == text.size();
}

// Runs argv (argv[0] an absolute path) with stdout and stderr to `log`.
// Returns the exit status, or -1 if it could not start.
int Run(const std::vector<std::string>& argv, const std::string& log) {
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid;
  const int rc = posix_spawn(&pid, argv[0].c_str(), &fa, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) return -1;
  int status = 0;
  if (waitpid(pid, &status, 0) < 0) return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

std::string Tail(const std::string& text, size_t n = 400) {
  return text.size() <= n ? text : text.substr(text.size() - n);
}

uint64_t Fnv1a(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

// ---------------------------------------------------------------------------
// The kernels: how to call each, and its reference in double precision.

// The system compiler's flags (also part of the disk cache's key).
const char* const kCompilerFlags[] = {"-O3", "-march=native", "-shared", "-fPIC"};

using SoftmaxFn = void (*)(int64_t, int64_t, const float*, float*);
using LayerNormGeluFn = void (*)(int64_t, int64_t, const float*, const float*, const float*,
                                 const float*, float*);

struct Inputs {
  int64_t rows = 0, cols = 0;
  std::vector<float> x, r, gamma, beta;
};

struct KernelSpec {
  int row_inputs;  // [rows, cols] arrays read (the output is one more, written)
  int col_inputs;  // [cols] vectors read
  void (*call)(void* fn, const Inputs& in, float* y);  // null: compile only
  void (*reference)(const Inputs& in, std::vector<double>* y);
};

void CallSoftmax(void* fn, const Inputs& in, float* y) {
  reinterpret_cast<SoftmaxFn>(fn)(in.rows, in.cols, in.x.data(), y);
}

void ReferenceSoftmax(const Inputs& in, std::vector<double>* y) {
  y->assign(in.x.size(), 0.0);
  for (int64_t i = 0; i < in.rows; ++i) {
    const float* x = &in.x[i * in.cols];
    double m = -INFINITY, s = 0;
    for (int64_t j = 0; j < in.cols; ++j) m = std::max(m, double{x[j]});
    for (int64_t j = 0; j < in.cols; ++j) s += std::exp(x[j] - m);
    for (int64_t j = 0; j < in.cols; ++j) (*y)[i * in.cols + j] = std::exp(x[j] - m) / s;
  }
}

void CallLayerNormGelu(void* fn, const Inputs& in, float* y) {
  reinterpret_cast<LayerNormGeluFn>(fn)(in.rows, in.cols, in.x.data(), in.r.data(),
                                        in.gamma.data(), in.beta.data(), y);
}

void ReferenceLayerNormGelu(const Inputs& in, std::vector<double>* y) {
  y->assign(in.x.size(), 0.0);
  std::vector<double> h(in.cols);
  for (int64_t i = 0; i < in.rows; ++i) {
    double mean = 0, var = 0;
    for (int64_t j = 0; j < in.cols; ++j) {
      h[j] = double{in.x[i * in.cols + j]} + in.r[i * in.cols + j];
      mean += h[j];
    }
    mean /= in.cols;
    for (int64_t j = 0; j < in.cols; ++j) var += (h[j] - mean) * (h[j] - mean);
    var /= in.cols;
    const double rstd = 1 / std::sqrt(var + 1e-5);
    for (int64_t j = 0; j < in.cols; ++j) {
      const double a = (h[j] - mean) * rstd * in.gamma[j] + in.beta[j];
      const double g = 0.5 * a * (1 + std::tanh(std::sqrt(2 / M_PI) * (a + 0.044715 * a * a * a)));
      (*y)[i * in.cols + j] = h[j] + g;
    }
  }
}

const std::map<std::string, KernelSpec>& Specs() {
  static const std::map<std::string, KernelSpec> specs = {
      {"softmax", {1, 0, CallSoftmax, ReferenceSoftmax}},
      {"layernorm_gelu", {2, 2, CallLayerNormGelu, ReferenceLayerNormGelu}},
      {"empty", {1, 0, nullptr, nullptr}},  // compiled, not run
  };
  return specs;
}

Inputs MakeInputs(int64_t rows, int64_t cols) {
  Inputs in;
  in.rows = rows;
  in.cols = cols;
  uint64_t s = 0x9E3779B97F4A7C15ull;
  auto uniform = [&s](float lo, float hi) {  // xorshift64*, deterministic
    s ^= s >> 12;
    s ^= s << 25;
    s ^= s >> 27;
    const double u = static_cast<double>((s * 2685821657736338717ull) >> 11) / 9007199254740992.0;
    return static_cast<float>(lo + (hi - lo) * u);
  };
  const size_t n = static_cast<size_t>(rows * cols);
  in.x.resize(n);
  in.r.resize(n);
  for (auto& v : in.x) v = uniform(-4, 4);
  for (auto& v : in.r) v = uniform(-1, 1);
  in.gamma.resize(cols);
  in.beta.resize(cols);
  for (auto& v : in.gamma) v = uniform(0.5f, 1.5f);
  for (auto& v : in.beta) v = uniform(-0.5f, 0.5f);
  return in;
}

// ---------------------------------------------------------------------------
// The two ways to get a callable kernel.

struct Compiled {
  void* fn = nullptr;
  void* handle = nullptr;  // dlopen handle (system compiler), or null
  std::string so_path;
  std::string error;
  std::map<std::string, double> ms;  // phases and "total"
};

Compiled CompileWithCompiler(const std::string& cxx, const std::string& source,
                             const std::string& dir) {
  Compiled c;
  const auto t0 = Clock::now();
  if (mkdir(dir.c_str(), 0755) != 0) {
    c.error = "mkdir " + dir + ": " + std::strerror(errno);
    return c;
  }
  const std::string src = dir + "/kernel.cc", so = dir + "/kernel.so", log = dir + "/compiler.log";
  if (!WriteFile(src, source)) {
    c.error = "cannot write " + src;
    return c;
  }
  c.ms["write"] = MsSince(t0);
  const auto t1 = Clock::now();
  std::vector<std::string> argv = {cxx};
  argv.insert(argv.end(), std::begin(kCompilerFlags), std::end(kCompilerFlags));
  argv.insert(argv.end(), {"-o", so, src});
  const int rc = Run(argv, log);
  c.ms["compiler"] = MsSince(t1);
  if (rc != 0) {
    std::string text;
    ReadFile(log, &text);
    c.error = cxx + " exited with " + std::to_string(rc) + ": " + Tail(text);
    return c;
  }
  const auto t2 = Clock::now();
  c.handle = dlopen(so.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!c.handle) {
    c.error = std::string("dlopen: ") + dlerror();
    return c;
  }
  c.fn = dlsym(c.handle, "kernel");
  c.ms["load"] = MsSince(t2);
  c.ms["total"] = MsSince(t0);
  c.so_path = so;
  if (!c.fn) c.error = "dlsym: kernel not found";
  return c;
}

using OrcCreateFn = int (*)(char*, size_t, char*, size_t);
using OrcCompileFn = void* (*)(const char*, size_t, const char*, double*, char*, size_t);

struct Orc {
  OrcCompileFn compile = nullptr;
  std::string error, info;
  double load_ms = NAN, create_ms = NAN;
};

Orc LoadOrc(const std::string& plugin) {
  Orc o;
  auto t0 = Clock::now();
  void* h = dlopen(plugin.c_str(), RTLD_NOW | RTLD_LOCAL);
  o.load_ms = MsSince(t0);
  if (!h) {
    o.error = std::string("dlopen: ") + dlerror();
    return o;
  }
  auto create = reinterpret_cast<OrcCreateFn>(dlsym(h, "pw_orc_create"));
  auto compile = reinterpret_cast<OrcCompileFn>(dlsym(h, "pw_orc_compile"));
  if (!create || !compile) {
    o.error = "pw_orc_create / pw_orc_compile not found in " + plugin;
    return o;
  }
  char err[2048] = "", info[512] = "";
  t0 = Clock::now();
  const int rc = create(err, sizeof err, info, sizeof info);
  o.create_ms = MsSince(t0);
  if (rc != 0) {
    o.error = std::string("LLJIT creation failed: ") + err;
    return o;
  }
  o.info = info;
  o.compile = compile;
  return o;
}

Compiled CompileWithOrc(const Orc& orc, const std::string& ir) {
  Compiled c;
  double phase[4] = {};
  char err[2048] = "";
  c.fn = orc.compile(ir.data(), ir.size(), "kernel", phase, err, sizeof err);
  if (!c.fn) {
    c.error = err;
    return c;
  }
  c.ms = {{"parse", phase[0]}, {"optimize", phase[1]}, {"codegen", phase[2]}, {"total", phase[3]}};
  return c;
}

std::string FlagsText() {
  std::string s;
  for (const char* f : kCompilerFlags) s += std::string(" ") + f;
  return s;
}

// The disk cache's file for a source: <dir>/<FNV-1a of the source and flags>.so.
std::string CachePath(const std::string& dir, const std::string& source) {
  char name[40];
  std::snprintf(name, sizeof name, "/%016llx.so",
                static_cast<unsigned long long>(Fnv1a(source + FlagsText())));
  return dir + name;
}

// A warm disk-cache hit: the key from the source, the cached file's
// existence, dlopen, dlsym.
Compiled CacheHit(const std::string& source, const std::string& cache_dir) {
  Compiled c;
  const auto t0 = Clock::now();
  const std::string path = CachePath(cache_dir, source);
  struct stat st;
  if (stat(path.c_str(), &st) != 0) {
    c.error = "not in the cache: " + path;
    return c;
  }
  c.handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (c.handle) c.fn = dlsym(c.handle, "kernel");
  c.ms["total"] = MsSince(t0);
  if (!c.fn) c.error = std::string("dlopen/dlsym failed: ") + (c.handle ? "no symbol" : dlerror());
  return c;
}

// ---------------------------------------------------------------------------
// Checking and timing the kernels.

// max over elements of |got - want| / max(|want|, 1e-3 max|want|).
double RelError(const std::vector<float>& got, const std::vector<double>& want) {
  double top = 0, err = 0;
  for (double w : want) top = std::max(top, std::fabs(w));
  const double floor = std::max(1e-3 * top, 1e-30);
  for (size_t i = 0; i < got.size(); ++i) {
    const double e = std::fabs(got[i] - want[i]) / std::max(std::fabs(want[i]), floor);
    if (!(e <= err)) err = e;  // NaN propagates
  }
  return err;
}

struct Args {
  std::string out, work, orc;
  int reps = 5;
  int64_t rows = 1024, cols = 1024;
  double batch_ms = 40;
  int batches = 7;
  std::vector<std::pair<std::string, std::string>> cxx;  // name, path
  struct K {
    std::string name, source_path, ir_path, source, ir;
  };
  std::vector<K> kernels;
};

bool ParseArgs(int argc, char** argv, Args* a, std::string* err) {
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) {
      *err = "missing value for " + flag;
      return false;
    }
    const std::string v = argv[++i];
    if (flag == "--out") {
      a->out = v;
    } else if (flag == "--work") {
      a->work = v;
    } else if (flag == "--orc") {
      a->orc = v;
    } else if (flag == "--reps") {
      a->reps = std::max(2, std::atoi(v.c_str()));
    } else if (flag == "--rows") {
      a->rows = std::atoll(v.c_str());
    } else if (flag == "--cols") {
      a->cols = std::atoll(v.c_str());
    } else if (flag == "--batches") {
      a->batches = std::max(1, std::atoi(v.c_str()));
    } else if (flag == "--batch-ms") {
      a->batch_ms = std::atof(v.c_str());
    } else if (flag == "--cxx") {
      const auto eq = v.find('=');
      if (eq == std::string::npos) {
        *err = "--cxx wants NAME=PATH";
        return false;
      }
      a->cxx.emplace_back(v.substr(0, eq), v.substr(eq + 1));
    } else if (flag == "--kernel") {
      const auto eq = v.find('='), comma = v.find(',');
      if (eq == std::string::npos) {
        *err = "--kernel wants NAME=SOURCE[,IR]";
        return false;
      }
      Args::K k;
      k.name = v.substr(0, eq);
      k.source_path = v.substr(eq + 1, comma == std::string::npos ? std::string::npos : comma - eq - 1);
      if (comma != std::string::npos) k.ir_path = v.substr(comma + 1);
      if (!Specs().count(k.name)) {
        *err = "unknown kernel " + k.name;
        return false;
      }
      if (!ReadFile(k.source_path, &k.source) ||
          (!k.ir_path.empty() && !ReadFile(k.ir_path, &k.ir))) {
        *err = "cannot read " + v;
        return false;
      }
      a->kernels.push_back(std::move(k));
    } else {
      *err = "unknown flag " + flag;
      return false;
    }
  }
  if (a->out.empty() || a->work.empty() || a->kernels.empty()) {
    *err = "--out, --work and --kernel are required";
    return false;
  }
  return true;
}

std::string CompiledJson(const Compiled& c) {
  Obj o;
  for (const auto& [k, v] : c.ms) o.Num(k + "_ms", v);
  if (!c.error.empty()) o.Str("error", c.error);
  return o.Text();
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  std::string err;
  if (!ParseArgs(argc, argv, &a, &err)) {
    std::fprintf(stderr, "bench: %s\n", err.c_str());
    return 2;
  }
  Obj top;
  top.Num("pid", getpid()).Num("reps", a.reps);

  Orc orc;
  const bool want_orc = !a.orc.empty();
  if (want_orc) {
    orc = LoadOrc(a.orc);
    top.Raw("orc", Obj().Num("load_ms", orc.load_ms).Num("create_ms", orc.create_ms)
                       .Str("info", orc.info).Str("error", orc.error).Text());
  }

  // Paths: the compilers by name, then "orc".
  std::vector<std::string> paths;
  for (const auto& [name, path] : a.cxx) paths.push_back(name);
  if (want_orc && orc.compile) paths.push_back("orc");

  // compile[kernel][path] = one Compiled per round (round 0 first).
  std::map<std::string, std::map<std::string, std::vector<Compiled>>> compiled;
  int dir_counter = 0;
  for (int round = 0; round <= a.reps; ++round) {
    for (const auto& k : a.kernels) {
      for (const auto& p : paths) {
        Compiled c;
        if (p == "orc") {
          if (k.ir.empty()) continue;
          c = CompileWithOrc(orc, k.ir);
        } else {
          const auto& cxx = std::find_if(a.cxx.begin(), a.cxx.end(),
                                         [&](const auto& e) { return e.first == p; })->second;
          const std::string dir = a.work + "/" + std::to_string(getpid()) + "_" +
                                  std::to_string(dir_counter++) + "_" + k.name + "_" +
                                  std::to_string(round);
          c = CompileWithCompiler(cxx, k.source, dir);
        }
        // Only the last round's kernels stay loaded (to be run); the others
        // are closed, so a cache hit below maps its .so anew.
        if (round < a.reps && c.handle) {
          dlclose(c.handle);
          c.handle = nullptr;
        }
        compiled[k.name][p].push_back(std::move(c));
      }
    }
  }

  std::vector<std::string> kernels_json;
  for (const auto& k : a.kernels) {
    const KernelSpec& spec = Specs().at(k.name);
    Obj ko;
    ko.Str("name", k.name).Num("source_bytes", k.source.size()).Num("ir_bytes", k.ir.size());
    ko.Num("source_lines", std::count(k.source.begin(), k.source.end(), '\n'));
    ko.Num("ir_lines", std::count(k.ir.begin(), k.ir.end(), '\n'));

    // Compile times per path.
    Obj co;
    for (const auto& [p, list] : compiled[k.name]) {
      std::vector<std::string> rounds;
      for (const auto& c : list) rounds.push_back(CompiledJson(c));
      co.Raw(p, JsonList(rounds));
    }
    ko.Raw("compile", co.Text());

    // Warm cache hits: the first compiler's .so of round 1, copied (untimed)
    // into a cache directory under its key, then found and loaded `reps`
    // times (closed after each, so every dlopen maps and relocates it anew).
    if (!a.cxx.empty()) {
      std::vector<std::string> hits;
      const auto& list = compiled[k.name][a.cxx.front().first];
      const std::string cache_dir = a.work + "/cache_" + std::to_string(getpid());
      std::string so;
      mkdir(cache_dir.c_str(), 0755);
      if (list.size() > 1 && ReadFile(list[1].so_path, &so) &&
          WriteFile(CachePath(cache_dir, k.source), so)) {
        for (int i = 0; i < a.reps; ++i) {
          Compiled h = CacheHit(k.source, cache_dir);
          if (h.handle) dlclose(h.handle);
          hits.push_back(CompiledJson(h));
        }
      }
      ko.Str("cache_hit_compiler", a.cxx.front().first).Raw("cache_hit", JsonList(hits));
    }

    if (!spec.call) {
      kernels_json.push_back(ko.Text());
      continue;
    }
    // The last round's kernels: check, compare, time.
    std::vector<std::pair<std::string, void*>> fns;
    for (const auto& p : paths) {
      const auto& list = compiled[k.name][p];
      if (!list.empty() && list.back().fn) fns.emplace_back(p, list.back().fn);
    }
    Obj run;
    std::map<std::string, std::vector<float>> outputs;  // of the large shape
    for (const auto& [rows, cols] : {std::pair<int64_t, int64_t>{7, 1000}, {a.rows, a.cols}}) {
      const Inputs in = MakeInputs(rows, cols);
      std::vector<double> want;
      spec.reference(in, &want);
      Obj shape;
      for (const auto& [p, fn] : fns) {
        std::vector<float> y(in.x.size(), NAN);
        spec.call(fn, in, y.data());
        shape.Num(p, RelError(y, want));
        if (rows == a.rows && cols == a.cols) outputs[p] = std::move(y);
      }
      run.Raw("rel_error_" + std::to_string(rows) + "x" + std::to_string(cols), shape.Text());
    }
    // Agreement between paths (on the large shape): identical bits, or the
    // largest difference relative to the first path's output.
    if (!fns.empty()) {
      const auto& base = outputs[fns.front().first];
      Obj agree;
      for (const auto& [p, y] : outputs) {
        size_t same = 0;
        double diff = 0, top = 0;
        for (float v : base) top = std::max(top, double{std::fabs(v)});
        for (size_t i = 0; i < y.size(); ++i) {
          same += std::memcmp(&y[i], &base[i], sizeof(float)) == 0;
          diff = std::max(diff, std::fabs(double{y[i]} - base[i]) /
                                    std::max(double{std::fabs(base[i])}, 1e-3 * top));
        }
        agree.Raw(p, Obj().Num("identical_fraction", double(same) / y.size())
                         .Num("max_rel_diff", diff).Text());
      }
      run.Str("agreement_base", fns.front().first).Raw("agreement", agree.Text());
    }
    // Timing: per path, batches of calls sized to ~batch_ms, interleaved.
    const Inputs in = MakeInputs(a.rows, a.cols);
    std::vector<float> y(in.x.size());
    const double bytes = 4.0 * (spec.row_inputs + 1) * a.rows * a.cols + 4.0 * spec.col_inputs * a.cols;
    std::map<std::string, int> calls;
    for (const auto& [p, fn] : fns) {  // warm-up, then size the batch
      const auto t0 = Clock::now();
      int n = 0;
      while (MsSince(t0) < a.batch_ms) {
        spec.call(fn, in, y.data());
        ++n;
      }
      calls[p] = std::max(1, n);
    }
    std::map<std::string, std::vector<double>> per_call_us;
    for (int b = 0; b < a.batches; ++b) {
      for (const auto& [p, fn] : fns) {
        const auto t0 = Clock::now();
        for (int i = 0; i < calls[p]; ++i) spec.call(fn, in, y.data());
        per_call_us[p].push_back(MsSince(t0) * 1e3 / calls[p]);
      }
    }
    Obj times;
    for (const auto& [p, v] : per_call_us) times.Raw(p, JsonNumbers(v));
    run.Num("bytes_per_call", bytes).Num("rows", a.rows).Num("cols", a.cols);
    run.Raw("per_call_us", times.Text());
    ko.Raw("run", run.Text());
    kernels_json.push_back(ko.Text());
  }
  top.Raw("kernels", JsonList(kernels_json));
  if (!WriteFile(a.out, top.Text() + "\n")) {
    std::fprintf(stderr, "bench: cannot write %s\n", a.out.c_str());
    return 1;
  }
  return 0;
}
