#pragma once
// The optimizer a parameter server applies: rebuilt from the name and settings() text a
// worker's config sends (train/optimizer_description.hpp), less what a server cannot apply:
// clipping by the global norm (it needs every gradient of a step, and each server holds a
// part) and optimizers that any_optimizer does not hold. The learning rate comes with every
// push (the worker's schedule at its step), so apply_optimizer takes it in place of the
// optimizer's own: a schedule never has to be followed on a server.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "gradus/core/error.hpp"
#include "gradus/core/shape.hpp"
#include "gradus/train/optimizer_description.hpp"

namespace gradus::ps {

/// The optimizer a worker's config names, rebuilt from `name` and its `settings` text.
/// Throws gradus::error for clipping by the global norm (clip_global_norm other than 0),
/// for an optimizer the servers do not apply (the message lists those they do), and for a
/// setting the optimizer does not have or whose text does not parse.
inline any_optimizer server_optimizer(const std::string& name, const optimizer_settings& settings) {
  constexpr std::string_view who = "gradus: parameter server";
  if (const auto it = settings.find("clip_global_norm"); it != settings.end()) {
    double clip = 0;
    read_optimizer_setting(clip, who, it->first, it->second);
    if (clip != 0) throw error(std::string(who) + ": clip_global_norm needs every gradient of a step at once; the servers each hold a part");
  }
  if (!any_optimizer::knows(name))
    throw error(std::string(who) + ": optimizer '" + name + "' is not one the servers apply (" + any_optimizer::names() + ")");
  return optimizer_from_description(name, settings, who);
}

/// One pass of the optimizer's rule over n elements at learning rate lr, on Compute.
template <class Compute, class T>
void apply_optimizer(const any_optimizer& opt, double lr, std::size_t n, T* w, const T* g, T* const* slots, std::int64_t step, double scale) {
  opt.visit([&](auto o) {
    o.lr = lr;
    o.template apply<Compute, T>(static_cast<index_t>(n), w, g, slots, step, scale);
  });
}

}  // namespace gradus::ps
