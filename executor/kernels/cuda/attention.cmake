# Causal GQA flash attention through cuDNN's fused SDPA graphs (cudnn_frontend 1.32, header-only) and its
# benchmark. attention.cpp is the one translation unit that includes the frontend: measured here (g++ 12), it
# takes 141 s CPU, 2.0 GB and a 49 MB object at RelWithDebInfo's -O2 -g, 58 s, 1.1 GB and 3 MB at -O1 -g0.
# Its code only builds cuDNN graphs and hands cuDNN a variant pack per call, so it gets -O1 -g0, and
# CUDNN_FRONTEND_SKIP_JSON_LIB drops the frontend's JSON serialization, which we never use.
add_library(moerun_cuda_attention STATIC ${CMAKE_CURRENT_LIST_DIR}/attention.cpp)
target_link_libraries(moerun_cuda_attention PUBLIC moerun_cuda_common moeplan_cudnn)
target_compile_definitions(moerun_cuda_attention PRIVATE CUDNN_FRONTEND_SKIP_JSON_LIB)
target_compile_options(moerun_cuda_attention PRIVATE -O1 -g0)
moeplan_warnings(moerun_cuda_attention)
target_link_libraries(moerun_cuda_kernels INTERFACE moerun_cuda_attention)

# FA3's convention (16k tokens, heads x head_dim = 2048, causal) at seq 4k/8k/16k, forward and backward.
add_executable(moerun_cuda_attention_bench ${CMAKE_CURRENT_LIST_DIR}/bench/attention_bench.cpp)
target_link_libraries(moerun_cuda_attention_bench PRIVATE moerun_cuda_attention moerun_cpu_kernels)
moeplan_warnings(moerun_cuda_attention_bench)
