# Tests of the memory-bound CUDA kernels (executor/kernels/cuda/memory.cmake) against the CPU kernels and the
# CPU wire format. Every case skips with "skipped: no CUDA device" when none answers.
add_executable(moerun_cuda_memory_tests ${PROJECT_SOURCE_DIR}/tests/main.cpp
  ${CMAKE_CURRENT_LIST_DIR}/memory_kernels_test.cpp)
target_link_libraries(moerun_cuda_memory_tests PRIVATE moerun_cuda_memory moerun_cpu_kernels moerun_wire
  doctest::doctest)
moeplan_warnings(moerun_cuda_memory_tests)
doctest_discover_tests(moerun_cuda_memory_tests PROPERTIES SKIP_REGULAR_EXPRESSION "skipped: no CUDA device")
