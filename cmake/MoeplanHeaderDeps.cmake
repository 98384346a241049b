# Header-only dependencies on a machine without our Debian packages: a lent GPU machine has CUDA, NCCL, cuDNN
# and OpenMPI but none of them, so executor/cuda/device_check.sh carries their headers in a prefix
# (MOEPLAN_HEADERS_PREFIX, made by executor/cuda/pack_device_deps.sh). Each is found as usual when installed;
# else it becomes an imported target over the prefix. Eigen, doctest, nlohmann_json, CLI11 and the Boost.Graph
# headers the engine includes are header-only; fmt is used header-only.
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

find_package(nlohmann_json 3.11 QUIET)
if(NOT TARGET nlohmann_json::nlohmann_json)
  find_path(MOEPLAN_JSON_DIR nlohmann/json.hpp HINTS ${MOEPLAN_HEADERS_PREFIX}/include NO_DEFAULT_PATH REQUIRED)
  add_library(nlohmann_json::nlohmann_json INTERFACE IMPORTED)
  set_target_properties(nlohmann_json::nlohmann_json PROPERTIES INTERFACE_INCLUDE_DIRECTORIES ${MOEPLAN_JSON_DIR})
endif()

find_package(CLI11 QUIET)
if(NOT TARGET CLI11::CLI11)
  find_path(MOEPLAN_CLI11_DIR CLI/CLI.hpp HINTS ${MOEPLAN_HEADERS_PREFIX}/include NO_DEFAULT_PATH REQUIRED)
  add_library(CLI11::CLI11 INTERFACE IMPORTED)
  set_target_properties(CLI11::CLI11 PROPERTIES INTERFACE_INCLUDE_DIRECTORIES ${MOEPLAN_CLI11_DIR})
endif()

find_package(Boost 1.74 QUIET)
if(NOT TARGET Boost::headers)
  find_path(MOEPLAN_BOOST_DIR boost/graph/adjacency_list.hpp HINTS ${MOEPLAN_HEADERS_PREFIX}/include NO_DEFAULT_PATH
            REQUIRED)
  add_library(Boost::headers INTERFACE IMPORTED)
  set_target_properties(Boost::headers PROPERTIES INTERFACE_INCLUDE_DIRECTORIES ${MOEPLAN_BOOST_DIR})
endif()

find_package(doctest QUIET)
if(NOT TARGET doctest::doctest)
  find_path(MOEPLAN_DOCTEST_DIR doctest/doctest.h HINTS ${MOEPLAN_HEADERS_PREFIX}/include NO_DEFAULT_PATH REQUIRED)
  add_library(doctest::doctest INTERFACE IMPORTED)
  set_target_properties(doctest::doctest PROPERTIES INTERFACE_INCLUDE_DIRECTORIES ${MOEPLAN_DOCTEST_DIR})
  list(APPEND CMAKE_MODULE_PATH ${MOEPLAN_HEADERS_PREFIX}/cmake)  # doctest.cmake: doctest_discover_tests()
endif()
