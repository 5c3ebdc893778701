#pragma once
// An optimizer as a description — its name and the exact text its settings() writes — and
// back. optimizer_from_description rebuilds the optimizer that wrote the text: each field
// that fields() names is read from its setting, and a setting the text leaves out keeps the
// optimizer's own default (its member initializer, the only place a default is written).
// A parameter server is told the workers' optimizer this way and applies it without their
// types (comm/ps/server.hpp); any_optimizer holds what it rebuilt.
//
//   const auto d = describe_optimizer(adamw{.lr = cosine_lr(0.01, 1920), .weight_decay = 0.05});
//   const any_optimizer o = optimizer_from_description(d.name, d.settings, "gradus: my tool");
//   // describe_optimizer(o) == d, and o applies the very updates the adamw does
//
// A setting's text: a number as strtod reads it (shortest_text writes one that reads back to
// the same bits), a flag "true" or "false", a learning rate a number or a schedule's
// describe() ("cosine(lr=0.01, total_steps=1920, warmup_steps=0, min_lr=0)"). An error
// begins with `who` and names the setting and its text.
#include <charconv>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <variant>

#include "gradus/core/error.hpp"
#include "gradus/train/optimizer.hpp"
#include "gradus/train/schedule.hpp"

namespace gradus {

/// An optimizer's hyper-parameters: setting name -> its exact text ("lr" -> "0.001", ...).
using optimizer_settings = std::map<std::string, std::string>;

/// An optimizer as data: its name ("sgd", "adam", "adamw") and the text of every setting, from
/// which optimizer_from_description rebuilds it exactly.
struct optimizer_description {
  std::string name;             ///< the optimizer's `name`: "sgd", "adam" or "adamw"
  optimizer_settings settings;  ///< setting -> its exact text, as settings() writes it
  /// Equal names and equal settings, text for text.
  bool operator==(const optimizer_description&) const = default;
};

/// The description of optimizer `o`: `Opt::name` and every setting its settings() writes.
template <class Opt>
optimizer_description describe_optimizer(const Opt& o) {
  optimizer_description d{std::string(Opt::name), {}};
  o.settings([&](std::string_view setting, std::string text) { d.settings.emplace(setting, std::move(text)); });
  return d;
}

namespace opt_detail {
template <class Opt, class Variant>
inline constexpr bool alternative_of = false;
template <class Opt, class... Alternatives>
inline constexpr bool alternative_of<Opt, std::variant<Alternatives...>> = (std::is_same_v<Opt, Alternatives> || ...);
}  // namespace opt_detail

/// One of the optimizers a description rebuilds, held by value.
class any_optimizer {
 public:
  /// The optimizers it may hold, in the order each_kind visits them.
  using variant = std::variant<sgd, adam, adamw>;

  any_optimizer() = default;  ///< sgd{}
  template <class Opt>
    requires(opt_detail::alternative_of<Opt, variant>)
  any_optimizer(Opt o) : opt_(std::move(o)) {}  ///< NOLINT: any of the optimizers is one

  /// f(the optimizer): std::visit over the one held.
  template <class F>
  decltype(auto) visit(F&& f) const {
    return std::visit(std::forward<F>(f), opt_);
  }
  /// The held optimizer's name: "sgd", "adam" or "adamw".
  std::string_view name() const {
    return visit([](const auto& o) { return std::string_view(o.name); });
  }
  /// The held optimizer's state tensors per variable (its slot_count()).
  int slot_count() const {
    return visit([](const auto& o) { return o.slot_count(); });
  }
  /// The name of state tensor k ("momentum", "adam_m", ...): "<variable>/<name>" in a checkpoint.
  std::string_view slot_name(int k) const {
    return visit([k](const auto& o) { return std::string_view(o.slot_name(k)); });
  }
  /// f(setting, value as exact text) for every hyper-parameter of the held optimizer.
  template <class F>
  void settings(F&& f) const {
    visit([&](const auto& o) { o.settings(f); });
  }

  /// f(std::type_identity<Opt>{}) for each optimizer it may hold, in order.
  template <class F>
  static void each_kind(F&& f) {
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      (f(std::type_identity<std::variant_alternative_t<I, variant>>{}), ...);
    }(std::make_index_sequence<std::variant_size_v<variant>>{});
  }
  /// Whether `name` is the name of one of the optimizers it may hold.
  static bool knows(std::string_view name) {
    bool found = false;
    each_kind([&](auto kind) { found = found || name == decltype(kind)::type::name; });
    return found;
  }
  /// Their names, comma-separated: "sgd, adam, adamw".
  static std::string names() {
    std::string all;
    each_kind([&](auto kind) { all += (all.empty() ? "" : ", ") + std::string(decltype(kind)::type::name); });
    return all;
  }

 private:
  variant opt_;
};

/// The description of the optimizer `o` holds (the same as describing that optimizer itself).
inline optimizer_description describe_optimizer(const any_optimizer& o) {
  return o.visit([](const auto& opt) { return describe_optimizer(opt); });
}

// ---- reading a setting's text back into its field -----------------------------------------

namespace opt_detail {
[[noreturn]] inline void bad_setting(std::string_view who, std::string_view setting, const std::string& text, std::string_view is_not) {
  throw error(std::string(who) + ": optimizer setting " + std::string(setting) + " = '" + text + "' is not " + std::string(is_not));
}
inline std::optional<double> number_text(const std::string& text) {
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (end == text.c_str() || *end) return std::nullopt;
  return v;
}
inline std::optional<std::int64_t> integer_text(std::string_view text) {
  std::int64_t v = 0;
  const auto r = std::from_chars(text.data(), text.data() + text.size(), v);
  if (r.ec != std::errc() || r.ptr != text.data() + text.size()) return std::nullopt;
  return v;
}
inline std::optional<bool> flag_text(std::string_view text) {
  if (text == "true") return true;
  if (text == "false") return false;
  return std::nullopt;
}

/// lr_schedule::describe()'s text read back: a number, or kind(parameter=value, ...) with
/// each of the kind's parameters once.
inline std::optional<lr_schedule> schedule_text(const std::string& text) {
  const auto open = text.find('(');
  if (open == std::string::npos) {
    const auto v = number_text(text);
    return v ? std::optional<lr_schedule>(lr_schedule(*v)) : std::nullopt;
  }
  if (text.back() != ')') return std::nullopt;
  std::map<std::string, std::string, std::less<>> p;  // parameter -> its text
  for (std::string_view rest = std::string_view(text).substr(open + 1, text.size() - open - 2); !rest.empty();) {
    const auto comma = rest.find(", ");
    const auto item = rest.substr(0, comma);
    const auto eq = item.find('=');
    if (eq == std::string_view::npos || !p.emplace(item.substr(0, eq), item.substr(eq + 1)).second) return std::nullopt;
    rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 2);
  }
  std::size_t used = 0;
  const auto number = [&](std::string_view k) {
    const auto it = p.find(k);
    return it == p.end() ? std::nullopt : (++used, number_text(it->second));
  };
  const auto integer = [&](std::string_view k) {
    const auto it = p.find(k);
    return it == p.end() ? std::nullopt : (++used, integer_text(it->second));
  };
  const auto flag = [&](std::string_view k) {
    const auto it = p.find(k);
    return it == p.end() ? std::nullopt : (++used, flag_text(it->second));
  };
  std::optional<lr_schedule> s;
  const std::string_view kind = std::string_view(text).substr(0, open);
  if (kind == "step") {
    const auto lr = number("lr"), gamma = number("gamma");
    const auto size = integer("step_size");
    if (lr && size && gamma) s = step_lr(*lr, *size, *gamma);
  } else if (kind == "exponential") {
    const auto lr = number("lr"), rate = number("decay_rate");
    const auto steps = integer("decay_steps");
    const auto staircase = flag("staircase");
    if (lr && rate && steps && staircase) s = exponential_lr(*lr, *rate, *steps, *staircase);
  } else if (kind == "cosine") {
    const auto lr = number("lr"), min_lr = number("min_lr");
    const auto total = integer("total_steps"), warmup = integer("warmup_steps");
    if (lr && total && warmup && min_lr) s = cosine_lr(*lr, *total, *warmup, *min_lr);
  }
  return used == p.size() ? s : std::nullopt;
}
}  // namespace opt_detail

/// One field from its setting's text: a number as strtod reads it (gradus::error, beginning
/// with `who` and naming the setting and its text, when the whole text is not one).
inline void read_optimizer_setting(double& field, std::string_view who, std::string_view setting, const std::string& text) {
  const auto v = opt_detail::number_text(text);
  if (!v) opt_detail::bad_setting(who, setting, text, "a number");
  field = *v;
}
/// A flag from "true" or "false" (gradus::error, beginning with `who`, for any other text).
inline void read_optimizer_setting(bool& field, std::string_view who, std::string_view setting, const std::string& text) {
  const auto v = opt_detail::flag_text(text);
  if (!v) opt_detail::bad_setting(who, setting, text, "true or false");
  field = *v;
}
/// A learning rate from a number or a schedule's describe() text, `step(...)`,
/// `exponential(...)` or `cosine(...)` with each of its parameters once and no other
/// (gradus::error, beginning with `who`, for any other text; the schedule's own gradus::error
/// for values it refuses, such as a negative rate).
inline void read_optimizer_setting(lr_schedule& field, std::string_view who, std::string_view setting, const std::string& text) {
  auto v = opt_detail::schedule_text(text);
  if (!v) opt_detail::bad_setting(who, setting, text, "a number or a schedule (step(...), exponential(...), cosine(...))");
  field = *v;
}

/// The optimizer `name` with the settings given, validated; a setting left out keeps the
/// optimizer's default. Throws gradus::error: beginning with `who` for a name no any_optimizer
/// holds, a setting the optimizer does not have, or a text that does not read as its field;
/// validate()'s or the schedule's own error for a value out of range.
inline any_optimizer optimizer_from_description(std::string_view name, const optimizer_settings& settings, std::string_view who) {
  std::optional<any_optimizer> built;
  any_optimizer::each_kind([&](auto kind) {
    using Opt = typename decltype(kind)::type;
    if (name != Opt::name) return;
    Opt o;
    std::string fields;
    Opt::fields(o, [&](const char* setting, auto& field) {
      fields += (fields.empty() ? "" : ", ") + std::string(setting);
      if (const auto it = settings.find(setting); it != settings.end()) read_optimizer_setting(field, who, setting, it->second);
    });
    for (const auto& given : settings) {  // (not a structured binding: clang++ 14 captures none)
      bool known = false;
      Opt::fields(o, [&](const char* f, const auto&) { known = known || given.first == f; });
      if (!known)
        throw error(std::string(who) + ": optimizer setting " + given.first + " = '" + given.second + "' is not one of " + Opt::name + "'s (" +
                    fields + ")");
    }
    o.validate();
    built = o;
  });
  if (!built) throw error(std::string(who) + ": optimizer '" + std::string(name) + "' is not one of " + any_optimizer::names());
  return *built;
}
/// optimizer_from_description(d.name, d.settings, who).
inline any_optimizer optimizer_from_description(const optimizer_description& d, std::string_view who) {
  return optimizer_from_description(d.name, d.settings, who);
}

}  // namespace gradus
