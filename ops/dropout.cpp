#include "ops/dropout.h"

#include "engine/autograd.h"
#include "engine/error.h"
#include "engine/threads.h"

namespace adjoint {

namespace {

constexpr int64_t kGrain = 1 << 14;

// out = a ⊙ b, both contiguous and of one shape.
Tensor multiply(const Tensor& a, const Tensor& b) {
  Tensor out = Tensor::empty(a.shape());
  const float *pa = a.data(), *pb = b.data();
  float* po = out.data();
  parallel_for(a.numel(), kGrain, [&](int64_t s, int64_t e) {
    for (int64_t i = s; i < e; ++i) po[i] = pa[i] * pb[i];
  });
  return out;
}

class DropoutNode : public Node {
public:
  explicit DropoutNode(Tensor scaled_mask) : scaled_mask_(std::move(scaled_mask)) {}
  std::string name() const override { return "dropout"; }
  // Linear given the mask: one rule for every transport.
  std::vector<Tensor> vjp(const Tensor& u, const Transport&) override { return {multiply(u, scaled_mask_)}; }

private:
  Tensor scaled_mask_;  // 1/(1 − p) where kept, 0 where dropped
};

}  // namespace

Tensor dropout(const Tensor& x, float p, bool training, Generator& gen) {
  check(p >= 0.0f && p <= 1.0f, "dropout: probability ", p, " is outside [0, 1] (input ", x.shape(), ")");
  if (!training || p == 0.0f) return x;
  Tensor xc = x.contiguous();
  Tensor mask = bernoulli(xc.shape(), 1.0f - p, gen);  // 1 = kept
  const float keep_scale = p < 1.0f ? 1.0f / (1.0f - p) : 0.0f;
  float* pm = mask.data();
  parallel_for(mask.numel(), kGrain, [&](int64_t s, int64_t e) {
    for (int64_t i = s; i < e; ++i) pm[i] *= keep_scale;
  });
  Tensor out = multiply(xc, mask);
  if (needs_grad({xc})) attach(out, std::make_shared<DropoutNode>(mask), {xc});
  return out;
}

}  // namespace adjoint
