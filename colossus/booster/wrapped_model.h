// The model a plugin wrapped, kept with its own type: later calls (the
// optimizer wrap, checkpoint IO) are handed the generic ModelWrapper and find
// the plugin's own by identity, so no plugin asks what type it was given.
#pragma once
#include "colossus/booster/plugin.h"
#include "colossus/core/errors.h"

#include <fmt/format.h>

#include <memory>
#include <string>
#include <string_view>

namespace colossus::booster {

template <class Wrapped>
class WrappedModel {
 public:
  explicit WrappedModel(std::string_view plugin) : plugin_(plugin) {}

  void set(const std::shared_ptr<Wrapped>& model) { model_ = model; }
  // Whether a model this plugin wrapped is still alive.
  bool alive() const { return !model_.expired(); }
  // `model` as this plugin's type; throws ConfigError naming `what` when it is
  // not the model this plugin wrapped.
  Wrapped& of(ModelWrapper& model, std::string_view what) const {
    auto mine = model_.lock();
    if (!mine || static_cast<ModelWrapper*>(mine.get()) != &model) {
      throw ConfigError(fmt::format("{}: the model was not boosted by this {} plugin; pass Boosted::model", what,
                                    plugin_));
    }
    return *mine;
  }
  // The model this plugin wrapped, for calls that are not handed one.
  Wrapped& current(std::string_view what) const {
    auto mine = model_.lock();
    if (!mine) throw ConfigError(fmt::format("{}: boost a model with this {} plugin first", what, plugin_));
    return *mine;
  }

 private:
  std::string plugin_;
  std::weak_ptr<Wrapped> model_;
};

}  // namespace colossus::booster
