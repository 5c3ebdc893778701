// The prose's model before a distributed fragment: placeholders, a loss, a session, the data.
#include <cstdint>
#include <vector>

#include <gradus/backends/cpu_simd.hpp>
#include <gradus/gradus.hpp>
// @INCLUDES@
namespace g = gradus;

int main() {
  g::placeholder<"x", float, g::dyn, 784> x;
  g::placeholder<"y", std::int32_t, g::dyn> y;
  g::nn::dense<"fc1", 784, 10> fc1;
  const auto loss = g::nn::softmax_cross_entropy_loss(fc1(x), y);
  g::session<g::cpu_simd> s;
  const auto init = [&](auto& session) { fc1.initialize(session, 1); };
  const g::data::dataset train(std::vector<float>(128 * 784), {784}, std::vector<std::int32_t>(128));
  const std::uint64_t seed = 1, epoch = 0;
  (void)s, (void)init, (void)seed, (void)epoch;
  // @SNIPPET@
}
