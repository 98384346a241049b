# Dependencies of a GPU-only build (MOEPLAN_GPU_ONLY: the CUDA kernels, their CPU references and their tests).
# On a machine with our Debian packages they are found as usual; on a lent GPU machine, which has CUDA but none
# of those packages, executor/cuda/device_check.sh carries their headers in a prefix (MOEPLAN_HEADERS_PREFIX,
# made by executor/cuda/pack_device_deps.sh): Eigen and doctest are header-only, fmt is used header-only.
set(MOEPLAN_HEADERS_PREFIX "" CACHE PATH "Prefix with include/{eigen3,fmt,doctest} and cmake/doctest*.cmake")
if(MOEPLAN_HEADERS_PREFIX)
  list(PREPEND CMAKE_PREFIX_PATH ${MOEPLAN_HEADERS_PREFIX})
endif()

find_package(Eigen3 3.4 QUIET NO_MODULE)
if(NOT TARGET Eigen3::Eigen)
  find_path(MOEPLAN_EIGEN_DIR Eigen/Core HINTS ${MOEPLAN_HEADERS_PREFIX}/include/eigen3 NO_DEFAULT_PATH REQUIRED)
  add_library(Eigen3::Eigen INTERFACE IMPORTED)
  set_target_properties(Eigen3::Eigen PROPERTIES INTERFACE_INCLUDE_DIRECTORIES ${MOEPLAN_EIGEN_DIR})
endif()

find_package(fmt QUIET)
if(NOT TARGET fmt::fmt)
  find_path(MOEPLAN_FMT_DIR fmt/format.h HINTS ${MOEPLAN_HEADERS_PREFIX}/include NO_DEFAULT_PATH REQUIRED)
  add_library(fmt::fmt INTERFACE IMPORTED)
  set_target_properties(fmt::fmt PROPERTIES INTERFACE_INCLUDE_DIRECTORIES ${MOEPLAN_FMT_DIR}
                                            INTERFACE_COMPILE_DEFINITIONS FMT_HEADER_ONLY=1)
endif()

find_package(doctest QUIET)
if(NOT TARGET doctest::doctest)
  find_path(MOEPLAN_DOCTEST_DIR doctest/doctest.h HINTS ${MOEPLAN_HEADERS_PREFIX}/include NO_DEFAULT_PATH REQUIRED)
  add_library(doctest::doctest INTERFACE IMPORTED)
  set_target_properties(doctest::doctest PROPERTIES INTERFACE_INCLUDE_DIRECTORIES ${MOEPLAN_DOCTEST_DIR})
  list(APPEND CMAKE_MODULE_PATH ${MOEPLAN_HEADERS_PREFIX}/cmake)  # doctest.cmake: doctest_discover_tests()
endif()
