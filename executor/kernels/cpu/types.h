// Types shared by moerun's CPU kernels. Every kernel is a function template on the scalar type, instantiated
// for float (what moerun runs) and double (what the finite-difference tests check): call it with the scalar
// spelled out, e.g. `linear_forward<float>(x, w)`.
//
// Layout: activations are row-major [tokens, features]; a weight of a linear layer is [in, out] (y = x W).
// Inputs are `const CRef<S>&` (a Matrix, a Map over a flat buffer or a block of either binds without a copy
// as long as rows are contiguous); outputs that accumulate are `MRef<S>` (writable, same rules).
#pragma once

#include <Eigen/Core>
#include <cstdint>
#include <span>
#include <vector>

namespace moeplan::executor::cpu {

template <class S>
using Mat = Eigen::Matrix<S, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <class S>
using Vec = Eigen::Matrix<S, Eigen::Dynamic, 1>;
template <class S>
using CRef = Eigen::Ref<const Mat<S>>;
template <class S>
using MRef = Eigen::Ref<Mat<S>>;
template <class S>
using CVecRef = Eigen::Ref<const Vec<S>>;

using Positions = std::span<const int64_t>;  // absolute token positions (or ids, or sequence numbers)

}  // namespace moeplan::executor::cpu
