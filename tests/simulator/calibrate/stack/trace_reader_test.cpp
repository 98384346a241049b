// Trace reading and kernel classification: dialects, Kineto's id chain, and one-line errors for truncated,
// foreign and kernel-less files.
#include <doctest/doctest.h>

#include <filesystem>
#include <string>

#include <fmt/format.h>

#include "simulator/calibrate/stack/kernel_patterns.h"
#include "simulator/calibrate/stack/trace_reader.h"

using namespace moeplan;
using namespace moeplan::calibrate;

namespace {
const std::string kData = std::string(MOEPLAN_SOURCE_DIR) + "/tests/simulator/calibrate/stack/data/";

std::string error_of(const Result<TraceFile>& r) {
  return r.ok() ? std::string("(no error)") : r.error().message;
}
}  // namespace

TEST_SUITE("calibrate") {
  TEST_CASE(
      "a Kineto export is detected and each kernel gets the input dims of the CPU op that launched it") {
    const auto t = read_trace(kData + "kineto_small.json");
    REQUIRE_MESSAGE(t.ok(), error_of(t));
    CHECK(t.value().dialect == TraceDialect::kKineto);
    REQUIRE(t.value().kernels.size() == 2);
    const KernelEvent& gemm = t.value().kernels[0];  // sorted by (device, stream): stream 7 first
    CHECK(gemm.stream == 7);
    CHECK(gemm.cpu_op == "aten::mm");
    REQUIRE(gemm.input_dims.size() == 2);
    CHECK(gemm.input_dims[1] == std::vector<int64_t>{1024, 2048});
    CHECK(gemm.input_types[0] == "c10::BFloat16");
    CHECK(gemm.launch_s == doctest::Approx(1002e-6));
    CHECK(gemm.dur_s == doctest::Approx(40e-6));
    CHECK(t.value().kernels[1].grid_blocks == 16);
    CHECK(t.value().kernels[1].cpu_op.empty());  // correlation 902 has no runtime event
    REQUIRE(t.value().ranges.size() == 1);
    CHECK(t.value().ranges[0].name == "ProfilerStep#2");
  }

  TEST_CASE("kernel events without CPU-side categories read as an Nsight Systems export") {
    const auto t = parse_trace(
        R"({"traceEvents":[{"ph":"X","cat":"cuda_kernel","name":"flash_fwd_kernel","pid":"Device 0","tid":"Stream 13","ts":5,"dur":2}]})",
        "n.json");
    REQUIRE_MESSAGE(t.ok(), error_of(t));
    CHECK(t.value().dialect == TraceDialect::kNsys);
    CHECK(t.value().kernels[0].stream == 13);
    CHECK(t.value().kernels[0].device == 0);
  }

  TEST_CASE("a truncated trace names the byte where it stops") {
    const auto t = read_trace(kData + "kineto_truncated.json");
    CHECK(error_of(t) == kData + "kineto_truncated.json: truncated at byte 700");
    const std::string cut = R"({"traceEvents": [{"ph":"X",)";  // stopped between two keys
    CHECK(error_of(parse_trace(cut, "t.json")) == fmt::format("t.json: truncated at byte {}", cut.size()));
  }

  TEST_CASE("a model file is not a Chrome trace and the error lists its top-level keys") {
    const auto t = read_trace(std::string(MOEPLAN_SOURCE_DIR) + "/models/dbrx.json");
    const std::string e = error_of(t);
    CHECK(e.find("dbrx.json: not a Chrome trace: no 'traceEvents' array (top-level keys: ") !=
          std::string::npos);
    CHECK(e.find("architectures") != std::string::npos);
  }

  TEST_CASE("an event without dur, ts or ph is rejected with its index") {
    CHECK(error_of(parse_trace(R"({"traceEvents":[{"ph":"M","name":"x"},{"ph":"X","name":"k","ts":1}]})",
                               "t.json")) == "t.json: event 1: 'dur' missing");
    CHECK(error_of(parse_trace(R"({"traceEvents":[{"ph":"X","name":"k","dur":1}]})", "t.json")) ==
          "t.json: event 0: 'ts' missing");
    CHECK(error_of(parse_trace(R"({"traceEvents":[{"name":"k"}]})", "t.json")) ==
          "t.json: event 0: 'ph' missing");
    CHECK(error_of(parse_trace(R"({"traceEvents":[{"ph":"X","name":"k","ts":1,"dur":"2"}]})", "t.json")) ==
          "t.json: event 0: 'dur' is not a number");
  }

  TEST_CASE("a trace without GPU kernels says so and how to record them") {
    const std::string e = error_of(parse_trace(
        R"({"traceEvents":[{"ph":"X","cat":"cpu_op","name":"aten::mm","ts":1,"dur":2}]})", "cpu.json"));
    CHECK(e.rfind("cpu.json: no GPU kernel events (1 complete events: 1 cpu_op)", 0) == 0);
    CHECK(error_of(parse_trace("  ", "e.json")) == "e.json: not a Chrome trace: the file is empty");
    CHECK(error_of(parse_trace("[1, 2}", "m.json")) ==
          "m.json: not a Chrome trace: malformed JSON at byte 6");
  }

  TEST_CASE("public kernel names fall into the kinds of the shipped pattern file") {
    const auto p = load_kernel_patterns();
    REQUIRE_MESSAGE(p.ok(), (p.ok() ? "" : p.error().message));
    const KernelPatterns& k = p.value();
    CHECK(k.classify("ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)") ==
          KernelKind::kNccl);
    CHECK(k.classify("ncclKernel_AllReduce_RING_LL_Sum_bfloat16") == KernelKind::kNccl);
    CHECK(k.classify("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1") ==
          KernelKind::kGemm);
    CHECK(k.classify("nvjet_tst_128x256_64x4_1x2_h_bz_coopA_TNT") == KernelKind::kGemm);
    CHECK(k.classify("ampere_bf16_s1688gemm_bf16_128x128_ldg8_f2f_stages_32x1_nn") == KernelKind::kGemm);
    CHECK(k.classify("void cutlass::device_kernel<cutlass::gemm::kernel::GemmUniversal<cutlass::gemm::"
                     "GroupProblemShape<cute::tuple<int, int, int>>>>") == KernelKind::kGroupedGemm);
    CHECK(k.classify(
              "void deep_gemm::sm90_fp8_gemm_1d2d_impl<0u, 4096u, 7168u, GemmType::MGroupedContiguous>") ==
          KernelKind::kGroupedGemm);
    CHECK(k.classify("void deep_gemm::sm90_fp8_gemm_1d2d_impl<0u, 4096u, 7168u, 1u>") == KernelKind::kGemm);
    CHECK(k.classify("void flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel<Flash_bwd_kernel_traits<128>>") ==
          KernelKind::kAttention);
    CHECK(k.classify("void moe_unpermute_kernel<__nv_bfloat16, float, true, 8>") == KernelKind::kPermute);
    CHECK(k.classify("void transformer_engine::normalization::rmsnorm_fwd_tuned_kernel<Traits>") ==
          KernelKind::kNorm);
    CHECK(k.classify("void transformer_engine::cast_transpose_kernel<8>") == KernelKind::kCast);
    CHECK(k.classify("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>") ==
          KernelKind::kElementwise);
    CHECK(k.classify("my_custom_kernel") == KernelKind::kOther);
    // DeepEP's kernels, and DeepSeek's own build of them in its published H800 training trace, are all
    // communication: dispatch, combine and the notify kernels before them.
    for (const char* name :
         {"void deep_ep::internode::combine<false, 8, __nv_bfloat16, 8>(int4*, float*)",
          "void deep_ep::intranode::notify_dispatch<8>(int const*, int*, int)",
          "void dpsk::ep::internode::dispatch<false, 8, false, 8>(int4*, float*, long*, float*)",
          "void dpsk::ep::internode::combine<false, 8, __nv_bfloat16, 8, 2, 16, 24>(int4*, float*, bool "
          "const*)",
          "void dpsk::ep::internode::notify_dispatch<false, 8>(int const*, long*, int)",
          "void dpsk::ep::internode::cached_notify<false>(int, int, int, int, int*)"}) {
      CAPTURE(name);
      CHECK(k.classify(name) == KernelKind::kNccl);
    }
  }

  TEST_CASE(
      "the shipped pattern file loads from any working directory, from the copy built into the binary") {
    namespace fs = std::filesystem;
    const fs::path before = fs::current_path();
    fs::current_path(fs::temp_directory_path());
    const auto p = load_kernel_patterns();
    fs::current_path(before);
    REQUIRE_MESSAGE(p.ok(), (p.ok() ? "" : p.error().message));
    CHECK(p.value().label == "builtin:hwprofiles/calibration/kernel_patterns.json");
    CHECK(p.value().classify("nvjet_tst_128x256_64x4_1x2_h_bz_coopA_TNT") == KernelKind::kGemm);
  }
}
