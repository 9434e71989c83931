// Prints the latency of CollectiveGroup::AllReduce (f32 sum) and AllGatherV
// (`count` floats from every rank), and of Arrive (which a cross-host gang
// makes before its first collective), over loopback TCP with the ranks as
// threads of this process: one row per (operation, ranks, count).
// Not a test; numbers depend on the machine (run on an idle one).
//
//   build/cpp/csrc/coordination/collective_group_benchmark [iterations]

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "csrc/coordination/collective_group.h"

namespace pw {
namespace {

enum class Op { kAllReduce, kAllGatherV, kArrive };

// Median and minimum microseconds per operation on `count` floats (per rank)
// over `n` ranks, measured on rank 0 after a barrier per iteration.
void Measure(Op op, int n, int64_t count, bool check_agreement, int iterations) {
  InMemoryKeyValueStore store;
  const std::string key = absl::StrCat("bench-", n, "-", count);
  CollectiveOptions options;
  options.check_agreement = check_agreement;
  std::vector<double> micros;
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      auto group = CollectiveGroup::Create(&store, key, r, n, options);
      if (!group.ok()) {
        std::fprintf(stderr, "%s\n", group.status().ToString().c_str());
        std::abort();
      }
      std::vector<float> data(count, 1.0f);
      std::vector<float> gathered(count * n);
      const std::vector<int64_t> bytes_per_rank(n, count * static_cast<int64_t>(sizeof(float)));
      for (int i = -3; i < iterations; ++i) {  // 3 warm-up rounds
        if (!(*group)->Barrier(1).ok()) std::abort();
        const auto start = std::chrono::steady_clock::now();
        absl::Status s =
            op == Op::kAllReduce   ? (*group)->AllReduce(DType::kF32, ReduceOp::kSum, data.data(), count, 0)
            : op == Op::kAllGatherV ? (*group)->AllGatherV(data.data(), bytes_per_rank[r], gathered.data(),
                                                            bytes_per_rank, 0)
                                    : (*group)->Arrive(0, absl::Seconds(30));
        const auto end = std::chrono::steady_clock::now();
        if (!s.ok()) {
          std::fprintf(stderr, "%s\n", s.ToString().c_str());
          std::abort();
        }
        if (r == 0 && i >= 0) micros.push_back(std::chrono::duration<double, std::micro>(end - start).count());
      }
    });
  }
  for (auto& t : threads) t.join();
  std::sort(micros.begin(), micros.end());
  const char* name = op == Op::kAllReduce ? "AllReduce" : op == Op::kAllGatherV ? "AllGatherV" : "Arrive";
  std::printf("%-10s  %5d  %9lld  %7s  %12.1f  %12.1f\n", name, n, static_cast<long long>(count), check_agreement ? "yes" : "no",
              micros[micros.size() / 2], micros.front());
}

}  // namespace
}  // namespace pw

int main(int argc, char** argv) {
  const int iterations = argc > 1 ? std::atoi(argv[1]) : 50;
  std::printf("f32, loopback TCP, ranks as threads, %d iterations\n", iterations);
  std::printf("operation   ranks      count  checked   median (us)      min (us)\n");
  for (int n : {2, 4}) pw::Measure(pw::Op::kArrive, n, 0, false, iterations);
  for (pw::Op op : {pw::Op::kAllReduce, pw::Op::kAllGatherV}) {
    for (int n : {2, 4}) {
      for (int64_t count : {int64_t{1}, int64_t{1} << 20}) {
        for (bool checked : {false, true}) pw::Measure(op, n, count, checked, iterations);
      }
    }
  }
  return 0;
}
