// Must not compile: logits for a batch of 8, labels for a batch of 6.
#include <cstdint>
#include <gradus/gradus.hpp>

int main() {
  gradus::placeholder<"logits", float, 8, 10> logits;
  gradus::placeholder<"labels", std::int32_t, 6> labels;
  auto loss = gradus::softmax_cross_entropy(logits, labels);
  (void)loss;
}
