// Must not compile: fp16 compute without a loss scaler (small gradients underflow fp16).
#include <gradus/gradus.hpp>

int main() {
  using fp16_unscaled = gradus::precision<gradus::f16, float, gradus::f16, gradus::no_loss_scale>;
  fp16_unscaled p;
  (void)p;
}
