# Header-only dependencies on a machine without our Debian packages: a lent GPU machine has CUDA, NCCL, cuDNN
# and OpenMPI but none of them, so executor/cuda/device_check.sh carries their headers in a prefix
# (MOEPLAN_HEADERS_PREFIX, made by executor/cuda/pack_device_deps.sh). Each is found as usual when installed;
# else it becomes an imported target over the prefix. Eigen, doctest, nlohmann_json, CLI11 and the Boost.Graph
# headers the engine includes are header-only; fmt is used header-only.
set(MOEPLAN_HEADERS_PREFIX "" CACHE PATH "Prefix with include/{eigen3,fmt,doctest} and cmake/doctest*.cmake")
if(MOEPLAN_HEADERS_PREFIX)
  list(PREPEND CMAKE_PREFIX_PATH ${MOEPLAN_HEADERS_PREFIX})
endif()

# TARGET, when no installed package provided it: an imported interface target over the prefix's
# include/SUBDIR, which must hold HEADER; DEFINITIONS are added to its users' compile definitions.
function(moeplan_carried_headers target header)
  cmake_parse_arguments(ARG "" "SUBDIR" "DEFINITIONS" ${ARGN})
  if(TARGET ${target})
    return()
  endif()
  string(MAKE_C_IDENTIFIER "MOEPLAN_CARRIED_${target}_DIR" dir)
  find_path(${dir} ${header} HINTS ${MOEPLAN_HEADERS_PREFIX}/include/${ARG_SUBDIR} NO_DEFAULT_PATH REQUIRED)
  add_library(${target} INTERFACE IMPORTED)
  set_target_properties(${target} PROPERTIES INTERFACE_INCLUDE_DIRECTORIES ${${dir}}
                                             INTERFACE_COMPILE_DEFINITIONS "${ARG_DEFINITIONS}")
endfunction()

find_package(Eigen3 3.4 QUIET NO_MODULE)
moeplan_carried_headers(Eigen3::Eigen Eigen/Core SUBDIR eigen3)
find_package(fmt QUIET)
moeplan_carried_headers(fmt::fmt fmt/format.h DEFINITIONS FMT_HEADER_ONLY=1)
find_package(nlohmann_json 3.11 QUIET)
moeplan_carried_headers(nlohmann_json::nlohmann_json nlohmann/json.hpp)
find_package(CLI11 QUIET)
moeplan_carried_headers(CLI11::CLI11 CLI/CLI.hpp)
find_package(Boost 1.74 QUIET)
moeplan_carried_headers(Boost::headers boost/graph/adjacency_list.hpp)
find_package(doctest QUIET)
if(NOT TARGET doctest::doctest)
  moeplan_carried_headers(doctest::doctest doctest/doctest.h)
  list(APPEND CMAKE_MODULE_PATH ${MOEPLAN_HEADERS_PREFIX}/cmake)  # doctest.cmake: doctest_discover_tests()
endif()
