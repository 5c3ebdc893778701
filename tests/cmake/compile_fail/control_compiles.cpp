// Control: the same ops with shapes that fit must compile, so the harness can pass.
#include <cstdint>
#include <gradus/gradus.hpp>

int main() {
  gradus::variable<"a", float, 3, 4> a;
  gradus::variable<"b", float, 1, 4> b;
  gradus::variable<"w", float, 4, 5> w;
  gradus::placeholder<"labels", std::int32_t, 3> labels;
  auto logits = gradus::matmul(a + b, w);                    // (3,4) x (4,5)
  auto loss = gradus::softmax_cross_entropy(logits, labels);  // batch 3 and 3
  auto t = gradus::permute<1, 0>(a);                          // (4,3)
  auto r = gradus::reshape<6, 2>(a);                          // 12 elements either way
  (void)loss;
  (void)t;
  (void)r;
}
