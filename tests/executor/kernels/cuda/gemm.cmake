# GEMM tests: cuBLASLt dense GEMMs (bf16 in the three training transposes, fp8 with per-tensor scales) and the
# grouped expert GEMM (forward, dgrad, wgrad with uneven and empty experts) against the CPU kernels.
add_executable(moerun_cuda_gemm_tests ${PROJECT_SOURCE_DIR}/tests/main.cpp ${CMAKE_CURRENT_SOURCE_DIR}/gemm_test.cpp)
target_link_libraries(moerun_cuda_gemm_tests PRIVATE moerun_cuda_gemm moerun_cpu_kernels doctest::doctest)
moeplan_warnings(moerun_cuda_gemm_tests)
doctest_discover_tests(moerun_cuda_gemm_tests PROPERTIES SKIP_REGULAR_EXPRESSION "skipped: no CUDA device")
