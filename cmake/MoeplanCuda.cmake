# Decides MOEPLAN_WITH_CUDA and, when on, enables the CUDA language and finds the toolkit and NCCL.
# Pitfalls (shared/reference/feasibility.md): CMake 3.25 has no nvcc C++20 flag, and libcuda is never linked
# (driver entry points come through cudaGetDriverEntryPointByVersion).
set(MOEPLAN_WITH_CUDA OFF)
if(NOT MOEPLAN_CUDA STREQUAL "OFF")
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    set(MOEPLAN_WITH_CUDA ON)
  elseif(MOEPLAN_CUDA STREQUAL "ON")
    message(FATAL_ERROR "MOEPLAN_CUDA=ON but no CUDA compiler was found")
  endif()
endif()

if(MOEPLAN_WITH_CUDA)
  enable_language(CUDA)
  if(CMAKE_VERSION VERSION_LESS 3.26 AND CMAKE_CUDA_COMPILER_ID STREQUAL "NVIDIA")
    set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
    set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
    list(APPEND CMAKE_CUDA_COMPILE_FEATURES cuda_std_20)
    set(CMAKE_CUDA20_COMPILE_FEATURES cuda_std_20)
  endif()
  set(CMAKE_CUDA_STANDARD 20)
  set(CMAKE_CUDA_STANDARD_REQUIRED ON)
  find_package(CUDAToolkit 12.8 REQUIRED)

  find_path(NCCL_INCLUDE_DIR nccl.h HINTS ${NCCL_ROOT} $ENV{NCCL_ROOT} ${CUDAToolkit_INCLUDE_DIRS}
            PATH_SUFFIXES include)
  find_library(NCCL_LIBRARY NAMES nccl libnccl.so.2 HINTS ${NCCL_ROOT} $ENV{NCCL_ROOT} ${CUDAToolkit_LIBRARY_DIR}
               PATH_SUFFIXES lib lib64)
  if(NCCL_INCLUDE_DIR)
    file(STRINGS "${NCCL_INCLUDE_DIR}/nccl.h" _nccl_v REGEX "^#define NCCL_(MAJOR|MINOR|PATCH) ")
    string(REGEX REPLACE ".*NCCL_MAJOR ([0-9]+).*NCCL_MINOR ([0-9]+).*NCCL_PATCH ([0-9]+).*" "\\1.\\2.\\3"
           NCCL_VERSION "${_nccl_v}")
  endif()
  include(FindPackageHandleStandardArgs)
  find_package_handle_standard_args(NCCL REQUIRED_VARS NCCL_LIBRARY NCCL_INCLUDE_DIR VERSION_VAR NCCL_VERSION)
  if(NCCL_VERSION VERSION_LESS 2.28)
    message(FATAL_ERROR "NCCL >= 2.28 is needed for the device API (nccl_device.h); found ${NCCL_VERSION}")
  endif()
  add_library(NCCL::nccl SHARED IMPORTED)
  set_target_properties(NCCL::nccl PROPERTIES IMPORTED_LOCATION "${NCCL_LIBRARY}"
                        INTERFACE_INCLUDE_DIRECTORIES "${NCCL_INCLUDE_DIR}")
endif()

# Header-only GPU libraries (scripts/install_deps.sh unpacks them from PyPI into .deps/) and cuDNN (the
# toolkit's, or CUDNN_ROOT). The CUTLASS kernels build for sm_90a alone: their wgmma paths exist only there.
if(MOEPLAN_WITH_CUDA)
  set(MOEPLAN_DEPS_DIR "${PROJECT_SOURCE_DIR}/.deps" CACHE PATH "Where scripts/install_deps.sh put the PyPI headers")
  find_path(CUTLASS_INCLUDE_DIR cutlass/cutlass.h HINTS ${MOEPLAN_DEPS_DIR}/cutlass/include NO_DEFAULT_PATH)
  find_path(CUDNN_FRONTEND_INCLUDE_DIR cudnn_frontend.h HINTS ${MOEPLAN_DEPS_DIR}/cudnn_frontend/include
            NO_DEFAULT_PATH)
  find_path(CUDNN_INCLUDE_DIR cudnn.h HINTS ${CUDNN_ROOT} $ENV{CUDNN_ROOT} ${CUDAToolkit_INCLUDE_DIRS}
            PATH_SUFFIXES include)
  find_library(CUDNN_LIBRARY NAMES cudnn libcudnn.so.9 HINTS ${CUDNN_ROOT} $ENV{CUDNN_ROOT}
               ${CUDAToolkit_LIBRARY_DIR} PATH_SUFFIXES lib lib64)
  if(NOT CUTLASS_INCLUDE_DIR OR NOT CUDNN_FRONTEND_INCLUDE_DIR)
    message(FATAL_ERROR "CUTLASS or cuDNN frontend headers not found under ${MOEPLAN_DEPS_DIR}: "
                        "run scripts/install_deps.sh (or configure with -DMOEPLAN_CUDA=OFF)")
  endif()
  if(NOT CUDNN_INCLUDE_DIR OR NOT CUDNN_LIBRARY)
    message(FATAL_ERROR "cuDNN 9 not found: set CUDNN_ROOT (or configure with -DMOEPLAN_CUDA=OFF)")
  endif()
  add_library(moeplan_cutlass INTERFACE)
  target_include_directories(moeplan_cutlass SYSTEM INTERFACE ${CUTLASS_INCLUDE_DIR})
  add_library(moeplan_cudnn INTERFACE)
  target_include_directories(moeplan_cudnn SYSTEM INTERFACE ${CUDNN_FRONTEND_INCLUDE_DIR} ${CUDNN_INCLUDE_DIR})
  # nvrtc by path: CMake's CUDA::nvrtc drags in the libcuda stub, which must never be linked.
  find_library(NVRTC_LIBRARY nvrtc HINTS ${CUDAToolkit_LIBRARY_DIR} NO_DEFAULT_PATH)
  target_link_libraries(moeplan_cudnn INTERFACE ${CUDNN_LIBRARY} ${NVRTC_LIBRARY} CUDA::cudart)
  message(STATUS "moeplan: CUTLASS ${CUTLASS_INCLUDE_DIR}; cuDNN ${CUDNN_LIBRARY}")
endif()
