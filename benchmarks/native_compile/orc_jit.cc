// The LLVM ORC path of benchmarks/native_compile.py: a shared object that
// bench.cc dlopens (so that loading libLLVM is timed on its own), built with
//   clang++-14 -O2 -shared -fPIC orc_jit.cc $(llvm-config-14 --cxxflags --ldflags --libs)
//
// pw_orc_create() makes one LLJIT per process for the host (CPU name and
// features detected, codegen at CodeGenOpt::Aggressive, as clang -O3), and
// a TargetMachine of the same description for the optimization pipeline.
// pw_orc_compile() takes unoptimized LLVM IR text and, in this process:
// parses it into a new LLVMContext, runs the new pass manager's O3 pipeline
// (PassBuilder::buildPerModuleDefaultPipeline, loop and SLP vectorization
// on, as clang -O3), adds the module to a new JITDylib of the LLJIT (one
// per kernel, so every kernel can be called "kernel") and looks the symbol
// up, which generates machine code and links it. Each phase is timed.
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>

#include "llvm/ExecutionEngine/Orc/ExecutionUtils.h"
#include "llvm/ExecutionEngine/Orc/JITTargetMachineBuilder.h"
#include "llvm/ExecutionEngine/Orc/LLJIT.h"
#include "llvm/ExecutionEngine/Orc/ThreadSafeModule.h"
#include "llvm/IR/LLVMContext.h"
#include "llvm/IR/Module.h"
#include "llvm/IRReader/IRReader.h"
#include "llvm/Passes/PassBuilder.h"
#include "llvm/Support/Host.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/SourceMgr.h"
#include "llvm/Support/TargetSelect.h"
#include "llvm/Support/raw_ostream.h"
#include "llvm/Target/TargetMachine.h"

namespace {

using Clock = std::chrono::steady_clock;

double MsSince(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

struct OrcState {
  std::unique_ptr<llvm::orc::LLJIT> jit;
  std::unique_ptr<llvm::TargetMachine> tm;  // the pipeline's target (the JIT makes its own)
  int kernels = 0;
};

OrcState* g_state = nullptr;

void SetError(char* err, size_t len, const std::string& what) {
  if (err && len) std::snprintf(err, len, "%s", what.c_str());
}

std::string ToString(llvm::Error e) {
  std::string s;
  llvm::raw_string_ostream os(s);
  os << e;
  return os.str();
}

}  // namespace

extern "C" {

// Creates the process's LLJIT. Returns 0, or -1 with `err` set. `info` gets
// "LLVM <version>; host <cpu>; <n> features".
int pw_orc_create(char* err, size_t err_len, char* info, size_t info_len) {
  if (g_state) return 0;
  llvm::InitializeNativeTarget();
  llvm::InitializeNativeTargetAsmPrinter();
  llvm::InitializeNativeTargetAsmParser();
  auto jtmb = llvm::orc::JITTargetMachineBuilder::detectHost();
  if (!jtmb) {
    SetError(err, err_len, ToString(jtmb.takeError()));
    return -1;
  }
  jtmb->setCodeGenOptLevel(llvm::CodeGenOpt::Aggressive);
  auto tm = jtmb->createTargetMachine();
  if (!tm) {
    SetError(err, err_len, ToString(tm.takeError()));
    return -1;
  }
  auto jit = llvm::orc::LLJITBuilder().setJITTargetMachineBuilder(*jtmb).create();
  if (!jit) {
    SetError(err, err_len, ToString(jit.takeError()));
    return -1;
  }
  // Symbols the optimized code may call (memset, sqrtf) resolve in this process.
  auto gen = llvm::orc::DynamicLibrarySearchGenerator::GetForCurrentProcess(
      (*jit)->getDataLayout().getGlobalPrefix());
  if (!gen) {
    SetError(err, err_len, ToString(gen.takeError()));
    return -1;
  }
  (*jit)->getMainJITDylib().addGenerator(std::move(*gen));
  if (info && info_len) {
    std::snprintf(info, info_len, "LLVM %s; host %s; %zu features", LLVM_VERSION_STRING,
                  (*tm)->getTargetCPU().str().c_str(), jtmb->getFeatures().getFeatures().size());
  }
  g_state = new OrcState{std::move(*jit), std::move(*tm)};
  return 0;
}

// Compiles `ir` (LLVM IR text) and returns the address of `symbol`, or
// nullptr with `err` set. phase_ms[0..3]: parse, optimize (O3), add to a
// new JITDylib + look up (machine code generation and linking), total.
void* pw_orc_compile(const char* ir, size_t ir_len, const char* symbol, double* phase_ms,
                     char* err, size_t err_len) {
  if (!g_state) {
    SetError(err, err_len, "pw_orc_create was not called");
    return nullptr;
  }
  const auto t0 = Clock::now();
  auto ctx = std::make_unique<llvm::LLVMContext>();
  llvm::SMDiagnostic diag;
  auto buffer = llvm::MemoryBuffer::getMemBuffer(llvm::StringRef(ir, ir_len), "kernel.ll",
                                                 /*RequiresNullTerminator=*/false);
  std::unique_ptr<llvm::Module> module = llvm::parseIR(*buffer, diag, *ctx);
  if (!module) {
    std::string s;
    llvm::raw_string_ostream os(s);
    diag.print("kernel.ll", os);
    SetError(err, err_len, os.str());
    return nullptr;
  }
  llvm::TargetMachine& tm = *g_state->tm;
  module->setDataLayout(tm.createDataLayout());
  module->setTargetTriple(tm.getTargetTriple().str());
  const double parse_ms = MsSince(t0);

  const auto t1 = Clock::now();
  {
    llvm::LoopAnalysisManager lam;
    llvm::FunctionAnalysisManager fam;
    llvm::CGSCCAnalysisManager cgam;
    llvm::ModuleAnalysisManager mam;
    llvm::PipelineTuningOptions pto;
    pto.LoopVectorization = true;  // clang sets both at -O2 and above
    pto.SLPVectorization = true;
    llvm::PassBuilder pb(&tm, pto);
    pb.registerModuleAnalyses(mam);
    pb.registerCGSCCAnalyses(cgam);
    pb.registerFunctionAnalyses(fam);
    pb.registerLoopAnalyses(lam);
    pb.crossRegisterProxies(lam, fam, cgam, mam);
    llvm::ModulePassManager mpm = pb.buildPerModuleDefaultPipeline(llvm::OptimizationLevel::O3);
    mpm.run(*module, mam);
  }
  const double opt_ms = MsSince(t1);

  const auto t2 = Clock::now();
  llvm::orc::LLJIT& jit = *g_state->jit;
  auto jd = jit.createJITDylib("kernel" + std::to_string(g_state->kernels++));
  if (!jd) {
    SetError(err, err_len, ToString(jd.takeError()));
    return nullptr;
  }
  jd->addToLinkOrder(jit.getMainJITDylib());
  if (auto e = jit.addIRModule(*jd, llvm::orc::ThreadSafeModule(std::move(module), std::move(ctx)))) {
    SetError(err, err_len, ToString(std::move(e)));
    return nullptr;
  }
  auto sym = jit.lookup(*jd, symbol);
  if (!sym) {
    SetError(err, err_len, ToString(sym.takeError()));
    return nullptr;
  }
  const double codegen_ms = MsSince(t2);
  if (phase_ms) {
    phase_ms[0] = parse_ms;
    phase_ms[1] = opt_ms;
    phase_ms[2] = codegen_ms;
    phase_ms[3] = MsSince(t0);
  }
  return reinterpret_cast<void*>(static_cast<uintptr_t>(sym->getAddress()));
}

}  // extern "C"
