# Fused tile-level GEMM + communication kernels (issue 6): all-gather + grouped GEMM, grouped GEMM +
# reduce-scatter, GEMM + all-to-all, all-to-all + GEMM, on symmetric peer buffers (NCCL windows, or virtual
# ranks on one GPU). Their tile shape and pipeline depth come from simulator/core/fused_kernels.h.
add_library(moerun_cuda_fused STATIC ${CMAKE_CURRENT_LIST_DIR}/fused/fused_gemm_comm.cu)
target_link_libraries(moerun_cuda_fused PUBLIC moerun_cuda_common moeplan_core)
moeplan_warnings(moerun_cuda_fused)
target_link_libraries(moerun_cuda_kernels INTERFACE moerun_cuda_fused)

# The fused kernels on CUTLASS's SM90 grouped kernel (fused/push_gemm.h: the experts' second GEMM and the
# Ulysses QKV GEMM with their exchanges in the epilogue, the experts' first GEMM chunk by chunk behind its
# gathers), so sm_90a alone and a library of its own, as the grouped GEMM (gemm.cmake).
add_library(moerun_cuda_push_gemm STATIC ${CMAKE_CURRENT_LIST_DIR}/fused/push_gemm.cu)
set_target_properties(moerun_cuda_push_gemm PROPERTIES CUDA_ARCHITECTURES 90a-real)
target_link_libraries(moerun_cuda_push_gemm PUBLIC moerun_cuda_common moeplan_core PRIVATE moeplan_cutlass)
target_compile_options(moerun_cuda_push_gemm PRIVATE
  $<$<COMPILE_LANGUAGE:CUDA>:--expt-relaxed-constexpr --expt-extended-lambda>)
moeplan_warnings(moerun_cuda_push_gemm)
target_link_libraries(moerun_cuda_kernels INTERFACE moerun_cuda_push_gemm)

# Benchmark: the fused kernels with 1, 2, 4 and 8 virtual ranks against the library GEMM alone (RESULT lines).
add_executable(moerun_cuda_fused_bench ${CMAKE_CURRENT_LIST_DIR}/bench/fused_bench.cu)
target_link_libraries(moerun_cuda_fused_bench PRIVATE moerun_cuda_fused moerun_cuda_push_gemm moerun_cuda_gemm)
moeplan_warnings(moerun_cuda_fused_bench)
