# Memory-bound CUDA kernels of moerun (issue 6): RMSNorm, SwiGLU, RoPE, router, permute / un-permute, FP8
# quantize / dequantize, cross-entropy, the Adam step; and their bandwidth benchmark. Included by
# CMakeLists.txt here.
add_library(moerun_cuda_memory STATIC
  ${CMAKE_CURRENT_LIST_DIR}/norm.cu
  ${CMAKE_CURRENT_LIST_DIR}/swiglu.cu
  ${CMAKE_CURRENT_LIST_DIR}/rope.cu
  ${CMAKE_CURRENT_LIST_DIR}/router.cu
  ${CMAKE_CURRENT_LIST_DIR}/permute.cu
  ${CMAKE_CURRENT_LIST_DIR}/fp8.cu
  ${CMAKE_CURRENT_LIST_DIR}/cross_entropy.cu
  ${CMAKE_CURRENT_LIST_DIR}/adam.cu)
target_link_libraries(moerun_cuda_memory PUBLIC moerun_cuda_common)
moeplan_warnings(moerun_cuda_memory)
target_link_libraries(moerun_cuda_kernels INTERFACE moerun_cuda_memory)

add_executable(moerun_cuda_memory_bench ${CMAKE_CURRENT_LIST_DIR}/bench/memory_bench.cu)
target_link_libraries(moerun_cuda_memory_bench PRIVATE moerun_cuda_memory moerun_cpu_kernels moerun_wire)
# The bench checks its kernels against the CPU (Eigen) kernels on the host only: Eigen's CUDA support off.
target_compile_definitions(moerun_cuda_memory_bench PRIVATE EIGEN_NO_CUDA)
moeplan_warnings(moerun_cuda_memory_bench)
