// What the convolution algorithms prepare from a layer's weights before their products:
// Winograd's transforms, the direct kernels' blocks, the GEMMs' packed operands. An
// eval-mode layer's weights change only when something writes them (an optimiser's step, a
// loader), so ops/conv.cpp lets them keep those forms with the weights' storage
// (PreparedForms, engine/tensor.h), made once per version of the values; elsewhere (a
// training step, whose weights change at every step) every call prepares its own and frees
// it when it returns. Either way the form is the same array, so the results are the same bits.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <utility>

#include "engine/tensor.h"

namespace adjoint::conv {

// Which form of the weights, the first word of its key; the rest of the key says what else
// the form depends on (orientation, block size, kernel family).
enum class WeightForm : uint64_t { Winograd, WinogradFlipped, Direct, Im2colPacked };

class PreparedWeights {
 public:
  // Nothing kept: each call prepares afresh.
  PreparedWeights() = default;
  // Forms kept with `weight`'s storage while its values hold.
  explicit PreparedWeights(const Tensor& weight) : weight_(weight) {}

  bool keeps() const { return weight_.defined(); }

  // The form of kind `form` with the key's other words `details`, made by `make` (which
  // returns it and the bytes it holds) when none is kept.
  template <class Form>
  std::shared_ptr<const Form> get(WeightForm form, std::initializer_list<uint64_t> details,
                                  const std::function<std::pair<std::shared_ptr<const Form>, int64_t>()>& make) const {
    if (!weight_.defined()) return make().first;
    PreparedForms::Key key{uint64_t(form)};
    key.insert(key.end(), details.begin(), details.end());
    return weight_.prepared<Form>(std::move(key), make);
  }

 private:
  Tensor weight_;
};

}  // namespace adjoint::conv
