// A small Megatron-Core job the predict tests share: four Mixtral-8x7B layers on two H100 nodes, ep 8 x etp
// 2, so the EP all-to-all crosses nodes and sits exposed on the critical path (the alltoall dispatcher runs
// it in line, after a host wait); four micro-batches.
#pragma once

#include "simulator/io/hardware_loader.h"
#include "simulator/io/model_loader.h"
#include "simulator/io/stack_loader.h"
#include "simulator/predict/predict.h"

namespace moeplan::test {

struct MegatronCase {
  ModelSpec model = [] {
    ModelSpec m = io::load_model("mixtral-8x7b").value();
    m.layers.resize(4);
    return m;
  }();
  HardwareProfile hw = io::load_hardware("h100-sxm").value();
  StackProfile stack = io::load_stack("megatron-core").value();
  Plan plan = [] {
    Plan p;
    p.gpus = 16;
    p.seq_len = 4096;
    p.global_batch = 64;
    p.experts.ep = 8;
    p.experts.etp = 2;
    p.overlap.dp_comm = true;
    return p;
  }();
  Prediction run() const { return run(stack); }
  Prediction run(const StackProfile& s) const {
    return predict(model, plan, hw, s, workload::uniform_routing(model.moe.num_experts));
  }
};

}  // namespace moeplan::test
