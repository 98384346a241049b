// The cost model's fused GEMM + collective ops (simulator/cost/cost_model.cpp) in closed form: with a
// negligible collective, a fused op costs its GEMM computed on the SMs its kernel leaves to tiles (the SM
// count less the kernel's communication SMs and kFusedSmsLeftForCollectives), and the kernel is the one
// moerun runs for the op (simulator/core/fused_ops.h): the output projection gathers forward and scatters in
// dgrad.
#include <doctest/doctest.h>

#include "simulator/core/fused_kernels.h"
#include "simulator/core/fused_ops.h"
#include "simulator/cost/cost_model.h"
#include "simulator/io/hardware_loader.h"
#include "simulator/io/stack_loader.h"

using namespace moeplan;

namespace {

Op gemm_op() {
  Op op;
  op.kind = OpKind::kGemm;
  op.dtype = DType::kBf16;
  op.gemm = {8192, 8192, 8192, 1};
  return op;
}

// The same GEMM fused with a 1 KiB all-to-all over 8 ranks (microseconds beside a ~1 ms GEMM).
Op fused_op(OpName name, GemmPart part) {
  Op op = gemm_op();
  op.kind = OpKind::kFusedGemmComm;
  op.name = static_cast<uint16_t>(name);
  op.part = part;
  op.comm.collective = Collective::kAllToAll;
  op.comm.group = CommGroup::kSp;
  op.comm.group_size = 8;
  op.comm.stride = 1;
  op.comm.bytes = 1024;
  return op;
}

}  // namespace

TEST_SUITE("cost") {
  TEST_CASE("a fused op's GEMM runs on the SMs its kernel leaves to tiles") {
    const HardwareProfile hw = io::load_hardware("h200-sxm").value();
    const StackProfile stack = io::load_stack("moerun").value();
    const cost::CostModel cm(hw, stack);
    const double launch = stack.launch_s_per_kernel.value, sms = static_cast<double>(hw.gpu.sm_count.value);
    const double gemm = cm.cost(gemm_op()).seconds - launch;
    REQUIRE(gemm > 1e-4);
    struct Case {
      OpName name;
      GemmPart part;
      int64_t comm_sms;
    };
    const Case cases[] = {
        {OpName::kQkvProjA2a, GemmPart::kNone, kGemmAllToAll.comm_sms},   // GEMM + all-to-all
        {OpName::kQkvProjA2a, GemmPart::kDgrad, kAllToAllGemm.comm_sms},  // its transpose
        {OpName::kA2aOutProj, GemmPart::kNone, kAllToAllGemm.comm_sms},   // all-to-all + GEMM
        {OpName::kA2aOutProj, GemmPart::kDgrad, kGemmAllToAll.comm_sms},  // its transpose
    };
    for (const Case& c : cases) {
      INFO(kOpNames[static_cast<size_t>(c.name)] << (c.part == GemmPart::kDgrad ? " dgrad" : ""));
      const double left = sms - static_cast<double>(c.comm_sms + kFusedSmsLeftForCollectives);
      CHECK(cm.cost(fused_op(c.name, c.part)).seconds - launch ==
            doctest::Approx(gemm * sms / left).epsilon(1e-3));
    }
    CHECK(kGemmAllToAll.comm_sms !=
          kAllToAllGemm.comm_sms);  // else the cases above could not tell them apart
  }
}
