// SGD with momentum, dampening, Nesterov and L2 weight decay, with
// torch.optim.SGD's semantics (the first step seeds the momentum buffer with
// the gradient itself).
#pragma once
#include "colossus/optim/stateful_optimizer.h"

namespace colossus::optim {

struct SGDOptions {
  double lr = 1e-3;
  double momentum = 0.0;
  double dampening = 0.0;
  double weight_decay = 0.0;
  bool nesterov = false;
};

// Group options: "momentum", "dampening", "nesterov" (0 or 1).
// State slot: "momentum_buffer" (once momentum != 0 and a step was taken).
class SGD : public StatefulOptimizer {
 public:
  explicit SGD(std::vector<at::Tensor> params, SGDOptions options = {});
  // Each group's lr and weight_decay are its own; the options fill the extras.
  explicit SGD(std::vector<ParamGroup> groups, SGDOptions options = {});
  void step() override;
  std::string name() const override { return "SGD"; }

 protected:
  void validate_group(const ParamGroup& group, size_t group_index) const override;
  std::vector<std::string> slot_names() const override { return {"momentum_buffer"}; }
  std::vector<std::string> required_slots(const ParamGroup& group) const override;

 private:
  SGD(std::vector<ParamGroup> groups, const SGDOptions& options, bool groups_given);
};

}  // namespace colossus::optim
