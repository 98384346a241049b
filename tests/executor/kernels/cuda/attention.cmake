# cuDNN flash attention forward and backward against the CPU attention kernel (TEST_SUITE("gpu")).
add_executable(moerun_cuda_attention_tests ${PROJECT_SOURCE_DIR}/tests/main.cpp
                                           ${CMAKE_CURRENT_LIST_DIR}/attention_test.cpp)
target_link_libraries(moerun_cuda_attention_tests PRIVATE moerun_cuda_attention moerun_cpu_kernels doctest::doctest)
moeplan_warnings(moerun_cuda_attention_tests)
doctest_discover_tests(moerun_cuda_attention_tests PROPERTIES SKIP_REGULAR_EXPRESSION "skipped: no CUDA device")
