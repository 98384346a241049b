// Adam with decoupled weight decay on the GPU (op optimizer): the CPU kernel's update
// (executor/kernels/cpu/adam.h) over a rank's shard as Megatron's distributed optimizer keeps it: fp32 master
// weights, fp32 main gradients and fp32 moments, and the bf16 copy of the weights that the GEMMs read written
// back. It moves kAdamStepBytesPerParam (30) bytes per parameter (simulator/core/model_stats.h): reads the
// gradient (4), reads and writes the master weight (8), m (8) and v (8), writes the bf16 weight (2).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace moeplan::cuda {

// The update's coefficients for one step, rounded to fp32 once from double (as the CPU kernel does):
//   m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
//   p = p - lr ((m inv_c1) / (sqrt(v inv_c2) + eps) + wd p),  inv_c1 = 1 / (1 - b1^step), likewise c2.
struct AdamCoefficients {
  float b1 = 0, b2 = 0, one_b1 = 0, one_b2 = 0, inv_c1 = 0, inv_c2 = 0, lr = 0, eps = 0, wd = 0;
};

// step counts from 1.
AdamCoefficients adam_coefficients(double lr, double beta1, double beta2, double eps, double weight_decay,
                                   int64_t step);

// One step over n parameters. Preconditions (bugs when broken): n >= 0, every pointer 16-byte aligned.
void adam_step(float* master, const float* grad, float* m, float* v, __nv_bfloat16* weight, int64_t n,
               const AdamCoefficients& c, cudaStream_t stream);

}  // namespace moeplan::cuda
