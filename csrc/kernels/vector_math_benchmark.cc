// Each function of vector_math.h against the loop the elementwise kernels
// ran before it: std:: once per element (compiled with the same flags as the
// kernels library). 1M elements (4 or 8 MiB per array, so from L2/L3 rather
// than L1), inputs uniform in a range where the function is commonly used,
// one thread. After Google Benchmark's own output, a table of ns per element
// and the speedup. Not a test; numbers depend on the machine (run it on an
// idle one).
//
//   build/cpp/csrc/kernels/vector_math_benchmark [--benchmark_filter=...]

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "benchmark/benchmark.h"
#include "csrc/kernels/vector_math.h"

namespace pw {
namespace {

constexpr int64_t kElements = 1 << 20;

template <typename T>
std::vector<T> Inputs(double lo, double hi) {
  std::mt19937 rng(1);
  std::uniform_real_distribution<double> uniform(lo, hi);
  std::vector<T> x(kElements);
  for (T& v : x) v = static_cast<T>(uniform(rng));
  return x;
}

template <typename T, typename F>
void Run(benchmark::State& state, double lo, double hi, F f) {
  const std::vector<T> x = Inputs<T>(lo, hi);
  std::vector<T> y(kElements);
  for (auto _ : state) {
    f(x.data(), y.data(), kElements);
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(state.iterations() * kElements);
  // Seconds per element (printed as e.g. "1.5n").
  state.counters["per_elem"] = benchmark::Counter(
      kElements, benchmark::Counter::kIsIterationInvariantRate | benchmark::Counter::kInvert);
}

// The scalar loop of a std:: function.
template <typename T, typename Scalar>
void StdLoop(const T* x, T* y, int64_t n, Scalar scalar) {
  for (int64_t i = 0; i < n; ++i) y[i] = scalar(x[i]);
}

struct Case {
  const char* name;
  double lo, hi;
  void (*ours32)(const float*, float*, int64_t);
  void (*ours64)(const double*, double*, int64_t);
  float (*std32)(float);
  double (*std64)(double);
};

const Case kCases[] = {
    {"exp", -10, 10, Exp, Exp, [](float v) { return std::exp(v); }, [](double v) { return std::exp(v); }},
    {"log", 1e-3, 1e3, Log, Log, [](float v) { return std::log(v); }, [](double v) { return std::log(v); }},
    {"tanh", -5, 5, Tanh, Tanh, [](float v) { return std::tanh(v); }, [](double v) { return std::tanh(v); }},
    {"sin", -10, 10, Sin, Sin, [](float v) { return std::sin(v); }, [](double v) { return std::sin(v); }},
    {"cos", -10, 10, Cos, Cos, [](float v) { return std::cos(v); }, [](double v) { return std::cos(v); }},
    {"sqrt", 0, 100, Sqrt, Sqrt, [](float v) { return std::sqrt(v); }, [](double v) { return std::sqrt(v); }},
    {"rsqrt", 0, 100, Rsqrt, Rsqrt, [](float v) { return 1 / std::sqrt(v); },
     [](double v) { return 1 / std::sqrt(v); }},
    {"logistic", -10, 10, Logistic, Logistic, [](float v) { return 1 / (1 + std::exp(-v)); },
     [](double v) { return 1 / (1 + std::exp(-v)); }},
    {"erf", -4, 4, Erf, Erf, [](float v) { return std::erf(v); }, [](double v) { return std::erf(v); }},
    {"erfc", -4, 10, Erfc, Erfc, [](float v) { return std::erfc(v); },
     [](double v) { return std::erfc(v); }},
};

void RegisterAll() {
  for (const Case& c : kCases) {
    const std::string name = c.name;
    benchmark::RegisterBenchmark((name + "/float/vector_math").c_str(), [c](benchmark::State& s) {
      Run<float>(s, c.lo, c.hi, c.ours32);
    });
    benchmark::RegisterBenchmark((name + "/float/std").c_str(), [c](benchmark::State& s) {
      Run<float>(s, c.lo, c.hi, [&](const float* x, float* y, int64_t n) { StdLoop(x, y, n, c.std32); });
    });
    benchmark::RegisterBenchmark((name + "/double/vector_math").c_str(), [c](benchmark::State& s) {
      Run<double>(s, c.lo, c.hi, c.ours64);
    });
    benchmark::RegisterBenchmark((name + "/double/std").c_str(), [c](benchmark::State& s) {
      Run<double>(s, c.lo, c.hi, [&](const double* x, double* y, int64_t n) { StdLoop(x, y, n, c.std64); });
    });
  }
}

// Console output as usual, and the ns/elem of every run kept for the table.
class TableReporter : public benchmark::ConsoleReporter {
 public:
  void ReportRuns(const std::vector<Run>& runs) override {
    ConsoleReporter::ReportRuns(runs);
    for (const Run& run : runs) {
      if (run.error_occurred || run.run_type != Run::RT_Iteration) continue;
      auto it = run.counters.find("per_elem");
      if (it != run.counters.end()) ns_per_element_[run.benchmark_name()] = it->second.value * 1e9;
    }
  }

  void PrintTable() const {
    std::printf("\n%-9s %-7s %18s %12s %9s\n", "function", "dtype", "vector_math ns/el", "std:: ns/el",
                "speedup");
    for (const Case& c : kCases) {
      for (const char* dtype : {"float", "double"}) {
        const std::string prefix = std::string(c.name) + "/" + dtype + "/";
        auto ours = ns_per_element_.find(prefix + "vector_math");
        auto std_loop = ns_per_element_.find(prefix + "std");
        if (ours == ns_per_element_.end() || std_loop == ns_per_element_.end()) continue;
        std::printf("%-9s %-7s %18.3f %12.3f %8.1fx\n", c.name, dtype, ours->second, std_loop->second,
                    std_loop->second / ours->second);
      }
    }
  }

 private:
  std::map<std::string, double> ns_per_element_;
};

}  // namespace
}  // namespace pw

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  pw::RegisterAll();
  pw::TableReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  reporter.PrintTable();
  benchmark::Shutdown();
  return 0;
}
