#pragma once
// Weights: a session's variables alone, for inference. A training checkpoint
// (io/checkpoint.hpp) also holds the optimizer's state and the step counter, which
// restore_checkpoint insists on finding in the session; load_weights takes only the
// variables, from either kind of file.
//
//   g::save_weights(s, "model.npz");                 // the variables: no optimizer state, no step
//   g::save_weights(s, "model.safetensors");         // the same in safetensors (by the extension)
//   g::load_weights(s, "run/ckpt.npz");              // every variable the session holds
//   g::load_weights(s, "run/ckpt.npz", logits);      // an inference session: the variables logits reads
//   g::load_weights(s, "torch.npz", logits, {.extra = g::extra_arrays::ignore});
//
// The session's variables are its tensors less the optimizer's state: a tensor named
// "<v>/<slot>" (the slot without a '/', as "fc1/w/adam_m") of v's dtype and shape, where v
// is another of its tensors. An inference session that has only run (or not yet run) a
// forward graph holds no variables: give load_weights the model's output, and it declares
// the variables the expression reads (as minimize() does) once the file has passed.
//
// load_weights reads the file and compares it with those variables first, and refuses,
// naming the file and listing every difference, a variable the file lacks, another dtype
// or shape (a 2-D array that is the variable's transpose is named as such: PyTorch's
// nn.Linear keeps its weight [out, in], gradus' nn::dense [in, out]), and an array that is
// none of the session's variables, their optimizer state ("<v>/<slot>" of a variable of
// the file or the session, of its shape) or checkpoint bookkeeping (global_step,
// gradus/world_size) — unless options.extra is extra_arrays::ignore (a PyTorch state_dict
// carries num_batches_tracked and the like). It then refuses NaN or Inf anywhere in the
// variables, and a pipeline stage's file (gradus/stages: one stage's variables; load each
// stage's file into that stage's session). Nothing is written into the session unless
// every check passes; the step counter and any optimizer state in the session are left
// as they were.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <map>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "gradus/core/error.hpp"
#include "gradus/exec/session.hpp"
#include "gradus/io/checkpoint.hpp"
#include "gradus/io/npz.hpp"
#include "gradus/io/safetensors.hpp"
#include "gradus/train/train_step.hpp"  // variables_of_t

namespace gradus {

/// What load_weights does with an array of the file that is neither a variable of the
/// session, nor optimizer state, nor checkpoint bookkeeping.
enum class extra_arrays { refuse, ignore };

/// How load_weights treats the file (designated initialisers: `{.extra = extra_arrays::ignore}`).
struct weights_options {
  extra_arrays extra = extra_arrays::refuse;  ///< refuse (the default) or ignore arrays the session has no use for
};

namespace detail {

/// A variable to be loaded: its name, dtype and shape.
struct weight_target {
  std::string name;
  element_type dtype;
  dims shape;
};

/// Whether `name` ("fc1/w/adam_m") is optimizer state of a tensor that `find` (name ->
/// pointer to something with dtype and shape, or nullptr) knows: "<v>/<slot>", slot without
/// a '/', of v's dtype and shape.
template <class Find>
bool is_optimizer_state(std::string_view name, element_type dtype, const dims& shape, const Find& find) {
  const auto slash = name.rfind('/');
  if (slash == std::string_view::npos || slash == 0 || slash + 1 == name.size()) return false;
  const auto* v = find(name.substr(0, slash));
  return v && v->dtype == dtype && v->shape == shape;
}

/// The session's variables: its tensors less optimizer state.
template <class Entries>
std::vector<weight_target> session_variables(const Entries& entries) {
  const auto find = [&](std::string_view n) {
    auto it = std::find_if(entries.begin(), entries.end(), [&](const auto& e) { return e.name == n; });
    return it == entries.end() ? nullptr : &*it;
  };
  std::vector<weight_target> r;
  for (const auto& e : entries)
    if (!is_optimizer_state(e.name, e.dtype, e.shape, find)) r.push_back({std::string(e.name), e.dtype, e.shape});
  return r;
}

/// The variables an expression reads, as targets.
template <class... Vs>
std::vector<weight_target> targets_of(std::tuple<Vs...>*) {
  return {weight_target{std::string(Vs::name.view()), element_type_of<typename Vs::value_type>,
                        static_dims<typename Vs::shape_type>()}...};
}

/// The file's array for each target (same order), once every check has passed; else an
/// error naming the file and every difference. `ctx`: "gradus: load_weights 'f': ".
inline std::vector<const io::npz_array*> match_weights(const std::vector<io::npz_array>& arrays,
                                                       const std::vector<weight_target>& targets,
                                                       const weights_options& options, const std::string& ctx) {
  std::map<std::string, const io::npz_array*, std::less<>> by_name;
  for (const auto& a : arrays) by_name.emplace(a.name, &a);
  if (auto st = by_name.find(stages_key); st != by_name.end()) {
    std::int64_t n = 0, k = -1;
    if (st->second->bytes.size() == sizeof n) std::memcpy(&n, st->second->bytes.data(), sizeof n);
    if (auto it = by_name.find(stage_key); it != by_name.end() && it->second->bytes.size() == sizeof k)
      std::memcpy(&k, it->second->bytes.data(), sizeof k);
    throw error(ctx + "the file holds stage " + std::to_string(k) + " of a " + std::to_string(n) +
                "-stage pipeline's checkpoint, only that stage's variables: load each stage's file "
                "(committed_stage_file) into the session of that stage, or a whole model's weights into a whole "
                "model; nothing was loaded");
  }
  std::map<std::string, const weight_target*, std::less<>> wanted;
  for (const auto& t : targets) wanted.emplace(t.name, &t);

  std::vector<std::string> diffs;
  bool transposed = false, extras = false, missing = false;
  std::vector<const io::npz_array*> found;
  for (const auto& t : targets) {
    auto it = by_name.find(t.name);
    found.push_back(it == by_name.end() ? nullptr : it->second);
    if (it == by_name.end()) {
      diffs.push_back("missing from the file: '" + t.name + "' " + to_string(t.shape) + " " +
                      std::string(name_of(t.dtype)));
      missing = true;
      continue;
    }
    const io::npz_array& a = *it->second;
    if (a.dtype == t.dtype && a.shape == t.shape) continue;
    const std::string want(name_of(t.dtype));
    std::string d = "'" + t.name + "': the session has " + to_string(t.shape) + " " + want + ", the file " +
                    to_string(a.shape) + " " + std::string(name_of(a.dtype));
    if (a.shape.rank == 2 && t.shape.rank == 2 && a.shape.d[0] == t.shape.d[1] && a.shape.d[1] == t.shape.d[0] &&
        !(a.shape == t.shape)) {
      d += " (the transpose: transpose it, w.T)";
      transposed = true;
    } else if (a.shape == t.shape) {
      d += " (write it as " + want + ": numpy's .astype(np." + want + "))";
    }
    diffs.push_back(std::move(d));
  }
  const auto find = [&](std::string_view n) -> const io::npz_array* {
    if (auto it = by_name.find(n); it != by_name.end()) return it->second;
    return nullptr;
  };
  const auto find_target = [&](std::string_view n) -> const weight_target* {
    if (auto it = wanted.find(n); it != wanted.end()) return it->second;
    return nullptr;
  };
  if (options.extra == extra_arrays::refuse)
    for (const auto& a : arrays) {
      if (wanted.count(a.name) || reserved_key(a.name) || policy_state(a.name) ||
          is_optimizer_state(a.name, a.dtype, a.shape, find) ||
          is_optimizer_state(a.name, a.dtype, a.shape, find_target))
        continue;
      diffs.push_back("not a variable of the session: '" + a.name + "' " + to_string(a.shape) + " " +
                      std::string(name_of(a.dtype)));
      extras = true;
    }
  if (!diffs.empty()) {
    std::string msg = ctx + "the file does not match the session's variables (nothing was loaded):";
    for (const auto& d : diffs) msg += "\n  " + d;
    if (transposed)
      msg += "\n  a transposed matrix: the file may come from PyTorch, whose nn.Linear holds its weight [out, in]; "
             "gradus' nn::dense holds w [in, out]: write weight.T into the file";
    if (missing)
      msg += "\n  variables the file lacks: was it written by another model (other layer names)? Write the file "
             "from a session of this model, or name its arrays as the session's variables";
    if (extras)
      msg += "\n  arrays the session lacks: rename them to the session's variable names, or skip them with "
             "{.extra = gradus::extra_arrays::ignore}";
    throw error(msg);
  }
  std::vector<std::string> bad;
  for (const auto* a : found)
    if (auto b = nonfinite_report(*a); !b.empty()) bad.push_back(std::move(b));
  if (!bad.empty()) {
    std::string msg = ctx + "the file holds NaN or Inf (a diverged run?); nothing was loaded:";
    for (const auto& b : bad) msg += "\n  " + b;
    throw error(msg);
  }
  return found;
}

/// Copies the checked arrays into the session's storage of each target (declared).
template <class Backend>
void write_weights(session<Backend>& s, const std::vector<weight_target>& targets,
                   const std::vector<const io::npz_array*>& arrays) {
  const auto entries = s.entries();
  for (std::size_t i = 0; i < targets.size(); ++i) {
    const auto e = std::find_if(entries.begin(), entries.end(), [&](const auto& x) { return x.name == targets[i].name; });
    Backend::copy_to_device(e->data, arrays[i]->bytes.data(), arrays[i]->bytes.size());
    s.mark_initialized(targets[i].name);
  }
}

}  // namespace detail

namespace detail {
/// A weights file's format is its extension's: .safetensors (Hugging Face's, what PyTorch
/// users exchange weights in), else .npz.
inline bool is_safetensors(const std::filesystem::path& file) { return file.extension() == ".safetensors"; }
inline std::vector<io::npz_array> read_weight_arrays(const std::filesystem::path& file) {
  return is_safetensors(file) ? io::read_safetensors(file) : io::read_npz(file);
}
}  // namespace detail

/// Writes the session's variables (not the optimizer's state, not the step counter) to
/// `file`: a .npz (np.load(file)["fc1/w"]), or safetensors when the name ends in
/// .safetensors (safetensors.numpy.load_file); atomic: a temporary file, then a rename.
template <class Backend>
void save_weights(const session<Backend>& s, const std::filesystem::path& file) {
  const auto bound = s.bind();
  const std::string ctx = "gradus: save_weights '" + file.string() + "': ";
  const auto all = s.entries();
  std::vector<typename session<Backend>::entry> vars;
  for (const auto& t : detail::session_variables(all))
    vars.push_back(*std::find_if(all.begin(), all.end(), [&](const auto& e) { return e.name == t.name; }));
  if (vars.empty())
    throw error(ctx + "the session holds no variables (initialise, assign or load them first); nothing was written");
  const auto host = detail::copy_to_host<Backend>(vars, ctx);
  if (detail::is_safetensors(file)) io::write_safetensors(file, host.refs);
  else io::write_npz(file, host.refs);
}

/// Loads every variable the session holds from `file`: a save_weights file (.npz or
/// .safetensors) or a training checkpoint (save_checkpoint). All or nothing; the header lists what is refused.
template <class Backend>
void load_weights(session<Backend>& s, const std::filesystem::path& file, const weights_options& options = {}) {
  const auto bound = s.bind();
  const std::string ctx = "gradus: load_weights '" + file.string() + "': ";
  const auto targets = detail::session_variables(s.entries());
  if (targets.empty())
    throw error(ctx + "the session holds no variables yet: pass the model, load_weights(s, file, logits), "
                "to declare the variables it reads, or declare them (gradus::declare(s, v)); nothing was loaded");
  const auto arrays = detail::read_weight_arrays(file);
  detail::write_weights(s, targets, detail::match_weights(arrays, targets, options, ctx));
}

/// Loads the variables `model` reads from `file`, declaring them in the session first (an
/// inference session of the forward graph alone); the checks are the other overload's.
template <class Backend, expression Model>
void load_weights(session<Backend>& s, const std::filesystem::path& file, const Model&,
                  const weights_options& options = {}) {
  const auto bound = s.bind();
  const std::string ctx = "gradus: load_weights '" + file.string() + "': ";
  const auto targets = detail::targets_of(static_cast<variables_of_t<Model>*>(nullptr));
  if (targets.empty()) throw error(ctx + "the model reads no variables; nothing was loaded");
  const auto arrays = detail::read_weight_arrays(file);
  const auto found = detail::match_weights(arrays, targets, options, ctx);
  [&]<class... Vs>(std::tuple<Vs...>*) { (declare(s, Vs{}), ...); }(static_cast<variables_of_t<Model>*>(nullptr));
  detail::write_weights(s, targets, found);
}

}  // namespace gradus
