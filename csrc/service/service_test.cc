// The service (service.h) against HostProcesses served in this process, with
// tenants as runtimes of their own (Runtime::CreateTenant): tenants' ids kept
// apart on the hosts, one order of their runs, a tenant that goes freed on
// every host, refusals on the service's port, and admission by priority.

#include "csrc/service/service.h"

#include <cstring>
#include <thread>

#include "absl/strings/match.h"
#include "absl/synchronization/notification.h"
#include "csrc/base/spin.h"
#include "csrc/client/runtime.h"
#include "csrc/client/service_link.h"
#include "csrc/coordination/protocol_version.h"
#include "csrc/host/host_process.h"
#include "csrc/program_ir/lowering.h"
#include "csrc/program_ir/testing_programs.h"
#include "csrc/scheduler/diagnosis.h"
#include "gtest/gtest.h"

namespace pw {
namespace {

constexpr char kHostSecret[] = "service-test-hosts";
constexpr char kSecret[] = "service-test-tenants";

class ServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ServiceConfig config;
    config.secret = kSecret;
    Start(config);
  }

  // Hosts, and a service over them with `config` (a host takes one owner
  // for its life: a new service needs new hosts).
  void Start(const ServiceConfig& config) {
    TearDown();
    TopologyOptions options;
    options.num_islands = 1;
    options.hosts_per_island = 2;
    options.devices_per_host = 2;
    options.num_executor_threads = 2;
    options.hosts = HostsMode::kLocalProcesses;
    std::vector<std::string> addresses;
    for (int h = 0; h < 2; ++h) {
      processes_.push_back(std::make_unique<HostProcess>(kHostSecret));
      auto server = HostServer::Start("127.0.0.1:0", kHostSecret, processes_.back().get());
      ASSERT_TRUE(server.ok()) << server.status();
      addresses.push_back((*server)->address());
      servers_.push_back(*std::move(server));
    }
    auto service = Service::Start(options, addresses, kHostSecret, config);
    ASSERT_TRUE(service.ok()) << service.status();
    service_ = *std::move(service);
  }

  void TearDown() override {
    service_.reset();
    servers_.clear();
    processes_.clear();
  }

  TenantOptions Options(const std::string& name, int devices = 0, int64_t memory = 0, double wait_s = 60) {
    TenantOptions tenant;
    tenant.address = service_->address();
    tenant.secret = kSecret;
    tenant.name = name;
    tenant.devices = devices;
    tenant.memory_bytes = memory;
    tenant.wait_timeout_ns = static_cast<int64_t>(wait_s * 1e9);
    return tenant;
  }

  std::unique_ptr<Runtime> Tenant(const std::string& name, int priority = 0) {
    TenantOptions tenant = Options(name);
    tenant.priority = priority;
    auto rt = Runtime::CreateTenant(tenant);
    EXPECT_TRUE(rt.ok()) << rt.status();
    return rt.ok() ? *std::move(rt) : nullptr;
  }

  // A tenant with a slice of all 4 devices (members in this order: the
  // slice goes before its runtime). The runtime is null if it could not
  // connect.
  struct TenantOnAll {
    std::unique_ptr<Runtime> rt;
    std::shared_ptr<VirtualSlice> slice;
  };
  TenantOnAll OnAllDevices(const std::string& name, int priority = 0) {
    TenantOnAll t{Tenant(name, priority), nullptr};
    if (t.rt != nullptr) {
      auto slice = t.rt->resource_manager().AddSlice(4, "tpu");
      EXPECT_TRUE(slice.ok()) << slice.status();
      if (slice.ok()) t.slice = *std::move(slice);
    }
    return t;
  }

  HostExecutor& Host(int h) { return *processes_[h]->executor(); }

  std::unique_ptr<Service> service_;

 private:

  std::vector<std::unique_ptr<HostProcess>> processes_;
  std::vector<std::unique_ptr<HostServer>> servers_;
};

// f(x) = simulated_compute(x + c, ns) over `slice`.
std::shared_ptr<const CompiledFunction> AddConst(Runtime& rt, const std::shared_ptr<VirtualSlice>& slice, double c,
                                                 int64_t ns = 0) {
  FunctionBuilder b("add", "i");
  const int32_t x = b.Parameter(DType::kF64, {});
  std::vector<uint8_t> bytes(8);
  std::memcpy(bytes.data(), &c, 8);
  const int32_t y = *b.Binary(OpKind::kAdd, x, *b.Constant(DType::kF64, {}, bytes));
  auto ir = *b.Build({*b.SimulatedCompute(y, ns)});
  return *CompiledFunction::Create(*FunctionExecutable::Compile(ir), testing::AllOf(slice), &rt.registry());
}

std::shared_ptr<const LoweredProgram> Chain(const std::shared_ptr<const CompiledFunction>& fn, int steps) {
  ProgramBuilder pb("chain");
  int v = *pb.AddArg(DType::kF64, {static_cast<int64_t>(fn->virtual_devices().size())});
  for (int i = 0; i < steps; ++i) v = (*pb.AddCall(fn, {v}))[0];
  return *Lower(*pb.Build({v}));
}

std::vector<double> Read(const ShardedBuffer& b) {
  std::vector<double> out(static_cast<size_t>(b.total_bytes() / 8));
  absl::Status s = b.ReadInto(out.data());
  EXPECT_TRUE(s.ok()) << s;
  return out;
}

// Sends `request` to `host` through a tenant's raw link; its reply's status.
absl::Status Call(ServiceLink& link, int host, const wire::Request& request) {
  absl::Notification got;
  absl::Status status = absl::DeadlineExceededError("no reply in 5 s");
  link.Send(host, request, [&](absl::StatusOr<wire::Reply> reply) {
    status = reply.ok() ? ReplyStatus(*reply) : reply.status();
    got.Notify();
  });
  link.Flush(host);
  if (!got.WaitForNotificationWithTimeout(absl::Seconds(5))) return absl::DeadlineExceededError("no reply in 5 s");
  return status;
}

TEST_F(ServiceTest, TenantsRunWithTheSameIdsApart) {
  auto a = Tenant("a");
  auto b = Tenant("b");
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(a->cluster().options().hosts, HostsMode::kService);
  EXPECT_EQ(a->cluster().devices().size(), 4u);
  EXPECT_EQ(service_->num_tenants(), 2);
  // Each has a session of its own with every host, for its bulk data.
  EXPECT_EQ(a->service()->direct_hosts(), 2);
  EXPECT_EQ(b->service()->direct_hosts(), 2);
  // Both tenants number their buffers, functions and programs from 1: on
  // the hosts they are apart.
  auto slice_a = *a->resource_manager().AddSlice(4, "tpu");
  auto slice_b = *b->resource_manager().AddSlice(4, "tpu");
  auto chain_a = Chain(AddConst(*a, slice_a, 1.0), 3);
  auto chain_b = Chain(AddConst(*b, slice_b, 10.0), 2);
  const double in[] = {1, 2, 3, 4};
  for (int i = 0; i < 5; ++i) {
    auto out_a = a->Execute(*chain_a, {ProgramArg{nullptr, in, DType::kF64, {4}}});
    auto out_b = b->Execute(*chain_b, {ProgramArg{nullptr, in, DType::kF64, {4}}});
    ASSERT_TRUE(out_a.ok()) << out_a.status();
    ASSERT_TRUE(out_b.ok()) << out_b.status();
    EXPECT_EQ(Read(*(*out_a)[0]), (std::vector<double>{4, 5, 6, 7}));
    EXPECT_EQ(Read(*(*out_b)[0]), (std::vector<double>{21, 22, 23, 24}));
  }
  // Each tenant's client shows in the service's report, with its gangs.
  wire::ServiceReport report = service_->Report();
  ASSERT_EQ(report.flows_size(), 2);
  EXPECT_EQ(report.flows(0).tenant_name(), "a");
  EXPECT_EQ(report.flows(0).gangs(), 15);
  EXPECT_EQ(report.flows(1).tenant_name(), "b");
  EXPECT_EQ(report.flows(1).gangs(), 10);
}

TEST_F(ServiceTest, ATenantThatGoesIsFreedOnEveryHostAndTheOthersGoOn) {
  auto [a, slice_a] = OnAllDevices("a");
  auto [b, slice_b] = OnAllDevices("b");
  ASSERT_NE(slice_a, nullptr);
  ASSERT_NE(slice_b, nullptr);
  const double in[] = {1, 2, 3, 4};
  // b holds one buffer; a holds many, and has a long queue on the devices.
  auto chain_b = Chain(AddConst(*b, slice_b, 10.0), 1);
  auto kept_b = *b->Execute(*chain_b, {ProgramArg{nullptr, in, DType::kF64, {4}}});
  ASSERT_TRUE(kept_b[0]->Await().ok());
  const int b_buffers = Host(0).num_buffers();
  auto chain_a = Chain(AddConst(*a, slice_a, 1.0), 2);
  std::vector<std::shared_ptr<ShardedBuffer>> held;
  for (int i = 0; i < 10; ++i) {
    auto out = *a->Execute(*chain_a, {ProgramArg{nullptr, in, DType::kF64, {4}}});
    ASSERT_TRUE(out[0]->Await().ok());
    held.push_back(out[0]);
  }
  auto slow_a = Chain(AddConst(*a, slice_a, 1.0, 200'000'000), 20);  // 4 s queued
  auto queued = *a->Execute(*slow_a, {ProgramArg{nullptr, in, DType::kF64, {4}}});
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_GT(Host(0).num_buffers(), b_buffers);
  // a goes as a killed process does, with its queue; within 2 s the hosts
  // hold b's buffers only. (a's own frees and cancels, after the cut, reach
  // no one.)
  const int64_t start = NowNanos();
  a->service()->Sever(absl::UnavailableError("killed"));
  held.clear();
  queued.clear();
  chain_a.reset();
  slow_a.reset();
  slice_a.reset();
  a.reset();
  while (Host(0).num_buffers() > b_buffers || Host(1).num_buffers() > b_buffers) {
    ASSERT_LT(NowNanos() - start, 2'000'000'000) << "hosts hold " << Host(0).num_buffers() << " and "
                                                 << Host(1).num_buffers() << " buffers, b " << b_buffers;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ(service_->num_tenants(), 1);
  // b's buffer is intact and b runs on.
  EXPECT_EQ(Read(*kept_b[0]), (std::vector<double>{11, 12, 13, 14}));
  auto again = b->Execute(*chain_b, {ProgramArg{nullptr, in, DType::kF64, {4}}});
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(Read(*(*again)[0]), (std::vector<double>{11, 12, 13, 14}));
}

TEST_F(ServiceTest, TheServicesPortRefusesWrongSecretsAndNonTenants) {
  TenantOptions wrong;
  wrong.address = service_->address();
  wrong.secret = "not the secret";
  wrong.connect_timeout_ns = 2'000'000'000;
  auto refused = Runtime::CreateTenant(wrong);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnauthenticated) << refused.status();
  // The hosts' secret is not the service's either.
  wrong.secret = kHostSecret;
  EXPECT_EQ(Runtime::CreateTenant(wrong).status().code(), absl::StatusCode::kUnauthenticated);
  // A client that would configure the service as a host is told what it is.
  wire::Hello hello;
  hello.set_protocol_version(kControlProtocolVersion);
  hello.set_op_registry_version(kOpRegistryVersion);
  ChannelOptions options;
  options.secret = kSecret;
  auto channel = HostChannel::Connect(service_->address(), hello, options);
  ASSERT_FALSE(channel.ok());
  EXPECT_TRUE(absl::StrContains(channel.status().message(), "pw.configure(server=")) << channel.status();
  // The service still serves.
  auto a = Tenant("a");
  ASSERT_NE(a, nullptr);
  auto slice = *a->resource_manager().AddSlice(2, "tpu");
  const double in[] = {1, 2};
  auto out = a->Execute(*Chain(AddConst(*a, slice, 1.0), 1), {ProgramArg{nullptr, in, DType::kF64, {2}}});
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(Read(*(*out)[0]), (std::vector<double>{2, 3}));
}

TEST_F(ServiceTest, ATenantMayNotSendTheHostsTheServicesRequests) {
  TenantOptions options;
  options.address = service_->address();
  options.secret = kSecret;
  auto link = ServiceLink::Connect(options);
  ASSERT_TRUE(link.ok()) << link.status();
  // Fault injection and session ends are the service's; so is a run that
  // skips admission.
  for (int kind = 0; kind < 2; ++kind) {
    wire::Request request;
    if (kind == 0) {
      request.mutable_fail_devices()->add_device_ids(0);
    } else {
      request.mutable_end_session();
    }
    const absl::Status status = Call(**link, 0, request);
    EXPECT_EQ(status.code(), absl::StatusCode::kPermissionDenied) << status;
  }
  wire::Request run;
  run.mutable_run()->set_program_id(1);
  const absl::Status status = Call(**link, 0, run);
  EXPECT_EQ(status.code(), absl::StatusCode::kPermissionDenied) << status;
  EXPECT_TRUE(absl::StrContains(status.message(), "admitted")) << status;
}

// A tenant's client closed while its runs wait at the service (here behind
// the window a tenant of higher priority leaves it): they fail with
// Cancelled at once, rather than each being admitted and cancelled on the
// hosts in turn behind the ones before it.
TEST_F(ServiceTest, ClosingAClientDropsItsRunsQueuedAtTheService) {
  auto high = Tenant("high", /*priority=*/5);  // idle: the low tenant keeps one run on the island
  auto low = Tenant("low");
  ASSERT_NE(high, nullptr);
  ASSERT_NE(low, nullptr);
  auto slice = *low->resource_manager().AddSlice(4, "tpu");
  auto slow = Chain(AddConst(*low, slice, 1.0, 100'000'000), 1);  // 0.1 s a run
  SchedulingClient* client = *low->CreateClient("c", 1.0);
  ExecuteOptions options;
  options.client = client;
  const double in[] = {1, 2, 3, 4};
  std::vector<std::shared_ptr<ShardedBuffer>> outs;
  for (int i = 0; i < 20; ++i) {  // 2 s of runs, one at a time on the island
    auto out = low->Execute(*slow, {ProgramArg{nullptr, in, DType::kF64, {4}}}, options);
    ASSERT_TRUE(out.ok()) << out.status();
    outs.push_back((*out)[0]);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  EXPECT_GT(service_->queued_runs(), 10);
  const int64_t start = NowNanos();
  low->CloseClient(client);
  for (const auto& out : outs) ASSERT_TRUE(out->AwaitFor(2'000'000'000));
  EXPECT_LT(NowNanos() - start, 1'000'000'000);  // not 20 runs' turns
  EXPECT_EQ(service_->queued_runs(), 0);
  const absl::Status last = outs.back()->status();
  EXPECT_EQ(last.code(), absl::StatusCode::kCancelled) << last;
  EXPECT_TRUE(absl::StrContains(last.message(), "its client 'c' was closed")) << last;
}

// Anticipation: when a higher tenant stepping in a closed loop has no run
// left, its islands are held a while for its next one (twice its usual
// gap), so a lower tenant's run queued meanwhile does not start in the gap;
// if it does not come back, the hold ends and the lower run goes.
TEST_F(ServiceTest, AHigherTenantsIslandsAreHeldForItsNextRun) {
  ServiceConfig config;
  config.secret = kSecret;
  config.max_anticipation_ns = int64_t{10} * 1'000'000'000;  // long, so that this test sees it
  Start(config);
  auto [high, high_slice] = OnAllDevices("high", /*priority=*/5);
  auto [low, low_slice] = OnAllDevices("low");
  ASSERT_NE(high_slice, nullptr);
  ASSERT_NE(low_slice, nullptr);
  auto step = Chain(AddConst(*high, high_slice, 1.0), 1);
  auto other = Chain(AddConst(*low, low_slice, 1.0), 1);
  const double in[] = {1, 2, 3, 4};
  auto run = [&](Runtime& rt, const LoweredProgram& program) {
    auto out = rt.Execute(program, {ProgramArg{nullptr, in, DType::kF64, {4}}});
    EXPECT_TRUE(out.ok()) << out.status();
    return out.ok() ? (*out)[0] : nullptr;
  };
  // Two steps 300 ms apart: its usual gap is 300 ms, and after the second
  // its island is held for 600 ms.
  ASSERT_TRUE(run(*high, *step)->Await().ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  ASSERT_TRUE(run(*high, *step)->Await().ok());
  auto low_out = run(*low, *other);
  ASSERT_NE(low_out, nullptr);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_EQ(service_->queued_runs(), 1);  // held for high's next step
  EXPECT_FALSE(low_out->IsDone());
  // High does not come back: the hold ends, and the low run goes.
  ASSERT_TRUE(low_out->AwaitFor(int64_t{5} * 1'000'000'000));
  EXPECT_EQ(Read(*low_out), (std::vector<double>{2, 3, 4, 5}));
  EXPECT_EQ(service_->queued_runs(), 0);
  // Starvation is bounded: while high steps every 50 ms (each gap held,
  // for twice its usual gap), a low run queued waits for at most
  // kMaxHoldsInARow holds, then goes in a gap.
  ASSERT_TRUE(run(*high, *step)->Await().ok());
  auto starved = run(*low, *other);
  ASSERT_NE(starved, nullptr);
  for (int i = 0; i < 3 * Service::kMaxHoldsInARow && !starved->IsDone(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    ASSERT_TRUE(run(*high, *step)->Await().ok());
  }
  EXPECT_TRUE(starved->IsDone());
  EXPECT_TRUE(starved->status().ok()) << starved->status();
}

// pw.diagnose in a tenant, with another tenant's gangs ahead of its own on
// the devices: each tenant's diagnosis lists its own waiting gangs only.
// (In one process the two tenants' program ids differ, so this does not
// show the ids colliding; HostExecutorTest.DescribeQueues... checks that a
// host tells another session's parts without their ids.)
TEST_F(ServiceTest, ATenantsDiagnosisShowsItsOwnGangsOnly) {
  auto [a, slice_a] = OnAllDevices("a");
  auto [b, slice_b] = OnAllDevices("b");
  ASSERT_NE(slice_a, nullptr);
  ASSERT_NE(slice_b, nullptr);
  const double in[] = {1, 2, 3, 4};
  // a: a gang of 1 s on the devices, then 5 more queued behind it; b: the
  // same program ids, one gang queued behind all of a's.
  auto slow_a = Chain(AddConst(*a, slice_a, 1.0, 1'000'000'000), 6);
  auto out_a = *a->Execute(*slow_a, {ProgramArg{nullptr, in, DType::kF64, {4}}});
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  auto quick_b = Chain(AddConst(*b, slice_b, 1.0), 1);
  auto out_b = *b->Execute(*quick_b, {ProgramArg{nullptr, in, DType::kF64, {4}}});
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  const Diagnosis seen_by_b = b->Diagnose();
  ASSERT_EQ(seen_by_b.waiting.size(), 1u) << seen_by_b.ToString();
  EXPECT_EQ(seen_by_b.waiting[0].gang.client, DefaultClientName()) << seen_by_b.ToString();
  const Diagnosis seen_by_a = a->Diagnose();
  EXPECT_EQ(seen_by_a.waiting.size(), 5u) << seen_by_a.ToString();  // its queued gangs, not b's
  a->Shutdown();
  b->Shutdown();
}

TEST_F(ServiceTest, ATenantCannotReadOrFreeAnotherTenantsBuffers) {
  auto a = Tenant("a");
  ASSERT_NE(a, nullptr);
  auto slice = *a->resource_manager().AddSlice(4, "tpu");
  const double in[] = {1, 2, 3, 4};
  auto out = a->Execute(*Chain(AddConst(*a, slice, 1.0), 1), {ProgramArg{nullptr, in, DType::kF64, {4}}});
  ASSERT_TRUE(out.ok()) << out.status();
  ASSERT_TRUE((*out)[0]->Await().ok());
  const uint64_t id = (*out)[0]->remote_id();
  // Tenant b names a's buffer id: in b's session there is no such buffer.
  TenantOptions options;
  options.address = service_->address();
  options.secret = kSecret;
  options.name = "b";
  auto b = ServiceLink::Connect(options);
  ASSERT_TRUE(b.ok()) << b.status();
  for (int h = 0; h < 2; ++h) {
    wire::Request fetch;
    fetch.mutable_fetch()->set_buffer_id(id);
    const absl::Status status = Call(**b, h, fetch);
    EXPECT_EQ(status.code(), absl::StatusCode::kNotFound) << status;
    wire::Request free;
    free.mutable_free()->add_buffer_ids(id);
    (*b)->Send(h, free, nullptr);
    (*b)->Flush(h);
  }
  // b's free reached the hosts (its echo comes back after it) and freed
  // nothing of a's.
  for (int h = 0; h < 2; ++h) {
    wire::Request echo;
    echo.mutable_echo()->set_payload("after");
    EXPECT_TRUE(Call(**b, h, echo).ok());
  }
  EXPECT_EQ(Read(*(*out)[0]), (std::vector<double>{2, 3, 4, 5}));
}

constexpr int64_t kMiB = int64_t{1} << 20;

// Quotas: a tenant holds devices and memory on them while connected; a
// request that does not fit waits for tenants to leave, or fails after its
// wait saying what it waited for and who holds it.
TEST_F(ServiceTest, TenantsHoldTheirDevicesAndMemoryAndWaitForThem) {
  // The default: every device, an eighth of each one's memory.
  {
    auto rt = Tenant("default");
    ASSERT_NE(rt, nullptr);
    EXPECT_EQ(rt->resource_manager().UsableDevices(), (std::vector<int>{0, 1, 2, 3}));
    EXPECT_EQ(rt->cluster().devices()[0]->memory_capacity(), (int64_t{1} << 30) / 8);
    EXPECT_EQ(service_->held_bytes(0), (int64_t{1} << 30) / 8);
  }
  // Its grant comes back once the hosts have freed its session.
  for (int i = 0; i < 500 && service_->held_bytes(0) != 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ASSERT_EQ(service_->held_bytes(0), 0);

  auto a = Runtime::CreateTenant(Options("a", 2, 768 * kMiB));
  ASSERT_TRUE(a.ok()) << a.status();
  const std::vector<int> a_devices = (*a)->resource_manager().UsableDevices();
  ASSERT_EQ(a_devices.size(), 2u);
  EXPECT_EQ((*a)->cluster().devices()[a_devices[0]]->memory_capacity(), 768 * kMiB);
  // Its slices go on its devices only.
  auto slice = (*a)->resource_manager().AddSlice(2, "tpu");
  ASSERT_TRUE(slice.ok()) << slice.status();
  for (Device* d : (*slice)->devices()->devices()) {
    EXPECT_TRUE(d->id() == a_devices[0] || d->id() == a_devices[1]) << d->ToString();
  }
  auto too_big = (*a)->resource_manager().AddSlice(3, "tpu");
  EXPECT_EQ(too_big.status().code(), absl::StatusCode::kResourceExhausted) << too_big.status();
  EXPECT_TRUE(absl::StrContains(too_big.status().message(), "this tenant's")) << too_big.status();

  // 4 devices x 512 MiB do not fit beside a: the wait ends with what it waited for.
  auto b = Runtime::CreateTenant(Options("b", 4, 512 * kMiB, 0.3));
  ASSERT_EQ(b.status().code(), absl::StatusCode::kResourceExhausted) << b.status();
  for (const char* says : {"4 devices with 536870912 bytes (512 MiB) free on each", "2 of the 4 devices",
                           "'a' (tenant", "2 devices x 805306368 bytes", "wait_timeout"}) {
    EXPECT_TRUE(absl::StrContains(b.status().message(), says)) << says << " in " << b.status();
  }
  // 2 x 512 MiB fit on the other two devices.
  auto c = Runtime::CreateTenant(Options("c", 2, 512 * kMiB));
  ASSERT_TRUE(c.ok()) << c.status();
  for (int d : (*c)->resource_manager().UsableDevices()) {
    EXPECT_NE(d, a_devices[0]);
    EXPECT_NE(d, a_devices[1]);
  }
  // d waits for 4 x 512 MiB until a has gone, and e (behind it, though it
  // would fit now) waits for d.
  absl::StatusOr<std::unique_ptr<Runtime>> d, e;
  std::thread waits_d([&] { d = Runtime::CreateTenant(Options("d", 4, 512 * kMiB, 30)); });
  for (int i = 0; i < 500 && service_->waiting_reservations() < 1; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  std::thread waits_e([&] { e = Runtime::CreateTenant(Options("e", 1, 64 * kMiB, 30)); });
  for (int i = 0; i < 500 && service_->waiting_reservations() < 2; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(service_->waiting_reservations(), 2);
  slice->reset();  // (a slice must not outlive its runtime)
  a->reset();
  waits_d.join();
  waits_e.join();
  ASSERT_TRUE(d.ok()) << d.status();
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ((*d)->resource_manager().UsableDevices().size(), 4u);
  // c's and d's on each device, and e's on one.
  int64_t held = 0;
  for (int dev = 0; dev < 4; ++dev) held += service_->held_bytes(dev);
  EXPECT_EQ(held, 2 * 512 * kMiB + 4 * 512 * kMiB + 64 * kMiB);
  // Work runs within a grant.
  auto e_slice = (*e)->resource_manager().AddSlice(1, "tpu");
  ASSERT_TRUE(e_slice.ok()) << e_slice.status();
  const double in[] = {1};
  auto out = (*e)->Execute(*Chain(AddConst(**e, *e_slice, 1.0), 2), {ProgramArg{nullptr, in, DType::kF64, {1}}});
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(Read(*(*out)[0]), (std::vector<double>{3}));
}

TEST_F(ServiceTest, ATenantNamesOnlyItsDevicesAndAsksForNoMoreThanItMay) {
  ServiceConfig config;
  config.secret = kSecret;
  config.max_tenant_devices = 2;
  config.tenant_memory_bytes = 64 * kMiB;
  config.max_tenant_memory_bytes = 256 * kMiB;
  Start(config);
  // More than a tenant may hold is refused at once, naming the limit.
  for (const auto& [devices, memory, says] :
       std::vector<std::tuple<int, int64_t, std::string>>{{3, 0, "devices=3: a tenant of this service holds 1 to 2"},
                                                           {-1, 0, "devices=-1"},
                                                           {1, 257 * kMiB, "at most 268435456 bytes (256 MiB)"},
                                                           {1, -5, "memory=-5"}}) {
    auto link = ServiceLink::Connect(Options("greedy", devices, memory));
    EXPECT_EQ(link.status().code(), absl::StatusCode::kInvalidArgument) << link.status();
    EXPECT_TRUE(absl::StrContains(link.status().message(), says)) << says << " in " << link.status();
  }
  // The default is the most devices a tenant may hold.
  auto link = ServiceLink::Connect(Options("one"));
  ASSERT_TRUE(link.ok()) << link.status();
  EXPECT_EQ((*link)->grant().device_ids_size(), 2);
  EXPECT_EQ((*link)->grant().memory_bytes(), 64 * kMiB);
  // A device list naming a device that is not its own is refused.
  std::vector<bool> mine(4, false);
  for (int d : (*link)->grant().device_ids()) mine[d] = true;
  int other = 0;
  while (mine[other]) ++other;
  wire::Request define;
  define.mutable_define_devices()->set_list_id(1);
  define.mutable_define_devices()->add_device_ids(other);
  const absl::Status refused = Call(**link, 0, define);
  EXPECT_EQ(refused.code(), absl::StatusCode::kPermissionDenied) << refused;
  EXPECT_TRUE(absl::StrContains(refused.message(), absl::StrCat("device ", other, " is not this tenant's")))
      << refused;
  // Its own is taken.
  define.mutable_define_devices()->set_device_ids(0, (*link)->grant().device_ids(0));
  const absl::Status taken = Call(**link, 0, define);
  EXPECT_TRUE(taken.ok()) << taken;
}

}  // namespace
}  // namespace pw
