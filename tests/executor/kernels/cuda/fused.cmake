# Fused GEMM + communication kernels with 1, 2, 4 and 8 virtual ranks against the CPU kernels' unfused
# sequence, and one on a real NCCL symmetric window. (Their schedule arithmetic is tested on the CPU in
# moeplan_tests: fused/schedule_test.cpp.)
add_executable(moerun_cuda_fused_tests ${PROJECT_SOURCE_DIR}/tests/main.cpp ${CMAKE_CURRENT_SOURCE_DIR}/fused_test.cpp)
target_link_libraries(moerun_cuda_fused_tests PRIVATE moerun_cuda_fused moerun_cuda_push_gemm moerun_nccl moerun_cpu_kernels doctest::doctest)
moeplan_warnings(moerun_cuda_fused_tests)
doctest_discover_tests(moerun_cuda_fused_tests PROPERTIES SKIP_REGULAR_EXPRESSION "skipped: no CUDA device")
