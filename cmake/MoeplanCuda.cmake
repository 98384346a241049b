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
