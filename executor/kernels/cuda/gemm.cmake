# moerun's GEMMs: dense GEMMs through cuBLASLt (gemm.cu) and the experts' grouped GEMM on CUTLASS's SM90 kernel
# (grouped_gemm.cu). The CUTLASS code builds for sm_90a alone (wgmma, TMA descriptor updates), and CMake 3.25
# has no per-source CUDA_ARCHITECTURES, so it is a library of its own.
add_library(moerun_cuda_grouped_gemm STATIC ${CMAKE_CURRENT_SOURCE_DIR}/grouped_gemm.cu)
set_target_properties(moerun_cuda_grouped_gemm PROPERTIES CUDA_ARCHITECTURES 90a-real)
target_link_libraries(moerun_cuda_grouped_gemm PUBLIC moerun_cuda_common PRIVATE moeplan_cutlass)
# CUTLASS's warp-specialised kernels need relaxed constexpr and extended lambdas (CUTLASS's own CMake sets both).
target_compile_options(moerun_cuda_grouped_gemm PRIVATE
  $<$<COMPILE_LANGUAGE:CUDA>:--expt-relaxed-constexpr --expt-extended-lambda>)
moeplan_warnings(moerun_cuda_grouped_gemm)

add_library(moerun_cuda_gemm STATIC ${CMAKE_CURRENT_SOURCE_DIR}/gemm.cu)
target_link_libraries(moerun_cuda_gemm PUBLIC moerun_cuda_common moerun_cuda_grouped_gemm CUDA::cublasLt CUDA::cublas)
moeplan_warnings(moerun_cuda_gemm)

target_link_libraries(moerun_cuda_kernels INTERFACE moerun_cuda_gemm)

# Benchmark: cuBLASLt bf16 / fp8 and the grouped GEMM at DeepSeek-V3-like expert shapes (RESULT lines).
add_executable(moerun_cuda_gemm_bench ${CMAKE_CURRENT_SOURCE_DIR}/bench/gemm_bench.cu)
target_link_libraries(moerun_cuda_gemm_bench PRIVATE moerun_cuda_gemm)
moeplan_warnings(moerun_cuda_gemm_bench)
