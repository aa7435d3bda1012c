// Layout ops and embedding: gradients, PyTorch goldens, shared storage, bad input.
#include <doctest/doctest.h>

#include "engine/autograd.h"
#include "engine/error.h"
#include "ops/elementwise.h"
#include "ops/embedding.h"
#include "ops/layout.h"
#include "tests/math_golden.h"
#include "tests/support.h"

using namespace adjoint;
using namespace adjoint::testing;

namespace {
bool shares(const Tensor& a, const Tensor& b) { return a.impl()->storage == b.impl()->storage; }
}  // namespace

TEST_CASE("layout: gradients match central differences") {
  const Tensor x = random_tensor({2, 3, 4}, 31);
  // Each view is followed by a product with a fixed tensor so that the checked map
  // is not the identity in disguise.
  auto weigh = [](const Tensor& t) { return t * random_tensor(t.shape(), 99); };
  check_gradients([&](const Args& v) { return weigh(reshape(v[0], {4, -1})); }, {x});
  check_gradients([&](const Args& v) { return weigh(flatten(v[0])); }, {x});
  check_gradients([&](const Args& v) { return weigh(permute(v[0], {2, 0, 1})); }, {x});
  check_gradients([&](const Args& v) { return weigh(transpose(v[0], 0, -1)); }, {x});
  check_gradients([&](const Args& v) { return weigh(slice(v[0], 2, 1, 4, 2)); }, {x});
  check_gradients([&](const Args& v) { return weigh(slice(v[0], 1, -2, 100)); }, {x});
  check_gradients([&](const Args& v) { return weigh(pad(v[0], {{0, 1}, {1, 0}, {2, 2}}, 0.5f)); }, {x});
  check_gradients([&](const Args& v) { return weigh(broadcast_to(v[0], {2, 3, 4})); }, {random_tensor({3, 1}, 32)});
  check_gradients([&](const Args& v) { return weigh(sum_to(v[0], {3, 1})); }, {x});
  check_gradients([&](const Args& v) { return weigh(unsqueeze(v[0], -1)); }, {x});
  check_gradients([&](const Args& v) { return weigh(squeeze(v[0], 1)); }, {random_tensor({2, 1, 4}, 33)});
  check_gradients(
      [&](const Args& v) {
        return weigh(concat({v[0], v[1], v[0]}, 1));
      },
      {random_tensor({2, 1, 4}, 34), random_tensor({2, 3, 4}, 35)});
  // Views of views, and reshape of a strided view (which copies first).
  check_gradients([&](const Args& v) { return weigh(reshape(slice(transpose(v[0], 0, 2), 1, 1, 3), {-1})); }, {x});
}

TEST_CASE("layout: forward and cotangents match PyTorch") {
  check_math_case("reshape", {"x"}, [](const Args& v) { return reshape(v[0], {4, -1}); });
  check_math_case("flatten", {"x"}, [](const Args& v) { return flatten(v[0], 1); });
  check_math_case("permute", {"x"}, [](const Args& v) { return permute(v[0], {2, 0, 1}); });
  check_math_case("transpose", {"x"}, [](const Args& v) { return transpose(v[0], 0, 2); });
  check_math_case("slice_step", {"x"}, [](const Args& v) { return slice(v[0], 2, 1, 4, 2); });
  check_math_case("slice_negative", {"x"}, [](const Args& v) { return slice(v[0], 1, -2, 3); });
  check_math_case("concat", {"a", "b", "c"}, [](const Args& v) { return concat(v, 1); });
  check_math_case("pad", {"x"}, [](const Args& v) { return pad(v[0], {{0, 0}, {1, 2}, {2, 1}}, 0.5f); });
  check_math_case("broadcast_to", {"x"}, [](const Args& v) { return broadcast_to(v[0], {2, 3, 4}); });
  check_math_case("sum_to", {"x"}, [](const Args& v) { return sum_to(v[0], {3, 1}); });
  check_math_case("unsqueeze", {"x"}, [](const Args& v) { return unsqueeze(v[0], 1); });
  check_math_case("squeeze", {"x"}, [](const Args& v) { return squeeze(v[0], 1); });
}

TEST_CASE("layout: views share storage, copies do not") {
  const Tensor x = random_tensor({2, 3, 4}, 36);
  CHECK(shares(reshape(x, {6, 4}), x));
  CHECK(shares(flatten(x), x));
  CHECK(shares(permute(x, {1, 2, 0}), x));
  CHECK(shares(transpose(x, 0, 1), x));
  CHECK(shares(slice(x, 1, 1, 3), x));
  CHECK(shares(unsqueeze(x, 0), x));
  CHECK(shares(squeeze(unsqueeze(x, 3), 3), x));
  const Tensor b = broadcast_to(random_tensor({4}, 37), {5, 4});
  CHECK(b.strides() == Shape{0, 1});
  CHECK(unsqueeze(x, 1).is_contiguous());
  // reshape of a strided view copies (contiguous() first), concat and pad always do.
  CHECK_FALSE(shares(reshape(transpose(x, 0, 2), {-1}), x));
  CHECK_FALSE(shares(concat({x}, 0), x));
  CHECK_FALSE(shares(pad(x, {{0, 0}, {0, 0}, {0, 0}}), x));
  // Values through views: slice with a step, then an element check.
  const Tensor s = slice(x, 2, 1, 4, 2);
  CHECK(s.shape() == Shape{2, 3, 2});
  CHECK(s.at({1, 2, 1}) == x.at({1, 2, 3}));
  CHECK(slice(x, 0, 5, 9).shape() == Shape{0, 3, 4});  // clipped to empty
}

TEST_CASE("layout: transports map the cotangent back") {
  const Tensor x = Tensor::from_vector({2, 3}, {1, 2, 3, 4, 5, 6});
  const Tensor u = Tensor::from_vector({2, 1}, {10, 20});
  // slice's transport pads with zeros where nothing was taken.
  CHECK(vjp([](const Args& v) { return slice(v[0], 1, 1, 2); }, {x}, u)[0].to_vector() ==
        std::vector<float>{0, 10, 0, 0, 20, 0});
  // permute's transport permutes back.
  const Tensor w = Tensor::from_vector({3, 2}, {1, 2, 3, 4, 5, 6});
  CHECK(vjp([](const Args& v) { return transpose(v[0], 0, 1); }, {x}, w)[0].to_vector() ==
        std::vector<float>{1, 3, 5, 2, 4, 6});
  // broadcast_to's transport sums the copies.
  CHECK(vjp(
            [](const Args& v) {
              return broadcast_to(v[0], {2, 2, 3});
            },
            {x}, Tensor::ones({2, 2, 3}))[0]
            .to_vector() == std::vector<float>{2, 2, 2, 2, 2, 2});
  // Linear maps: every transport gives the same.
  auto f = [](const Args& v) { return pad(transpose(v[0], 0, 1), {{1, 0}, {0, 1}}); };
  const Tensor cot = random_tensor({4, 3}, 38);
  const auto g = vjp(f, {x}, cot);
  for (const Transport& t : {Transport::pullback(), Transport::soft_pullback()})
    CHECK(vjp(f, {x}, cot, t)[0].to_vector() == g[0].to_vector());
}

TEST_CASE("layout: bad input") {
  const Tensor x = Tensor::zeros({2, 3, 4});
  CHECK_THROWS_WITH_AS(reshape(x, {5, -1}),
                       doctest::Contains("reshape: cannot infer -1 in [5, -1] for input [2, 3, 4]"), Error);
  CHECK_THROWS_WITH_AS(reshape(x, {-1, -1}), doctest::Contains("more than one -1"), Error);
  CHECK_THROWS_WITH_AS(reshape(x, {4, 5}), doctest::Contains("target shape [4, 5] has 20"), Error);
  CHECK_THROWS_WITH_AS(permute(x, {0, 1}), doctest::Contains("permute: 2 axes given for input [2, 3, 4]"), Error);
  CHECK_THROWS_WITH_AS(permute(x, {0, 1, 1}), doctest::Contains("appears twice"), Error);
  CHECK_THROWS_WITH_AS(transpose(x, 0, 3), doctest::Contains("transpose: axis 3 is out of range"), Error);
  CHECK_THROWS_WITH_AS(slice(x, 1, 0, 2, 0), doctest::Contains("slice: step 0 must be positive"), Error);
  CHECK_THROWS_WITH_AS(concat({x, Tensor::zeros({2, 4, 5})}, 1),
                       doctest::Contains("concat: tensor 1 has shape [2, 4, 5], tensor 0 has [2, 3, 4]"), Error);
  CHECK_THROWS_WITH_AS(concat({}, 0), doctest::Contains("concat: no tensors"), Error);
  CHECK_THROWS_WITH_AS(pad(x, {{1, 1}}), doctest::Contains("pad: 1 (before, after) pairs for input [2, 3, 4]"), Error);
  CHECK_THROWS_WITH_AS(pad(x, {{0, 0}, {0, -1}, {0, 0}}), doctest::Contains("pad: negative padding"), Error);
  CHECK_THROWS_WITH_AS(broadcast_to(x, {3, 3, 4}),
                       doctest::Contains("broadcast_to: cannot broadcast [2, 3, 4] to [3, 3, 4]"), Error);
  CHECK_THROWS_WITH_AS(sum_to(x, {2, 4}),
                       doctest::Contains("sum_to: shape [2, 4] does not broadcast to input [2, 3, 4]"), Error);
  CHECK_THROWS_WITH_AS(squeeze(x, 1), doctest::Contains("squeeze: axis 1 of input [2, 3, 4] has extent 3"), Error);
  CHECK_THROWS_WITH_AS(flatten(Tensor::scalar(1)), doctest::Contains("flatten"), Error);
}

TEST_CASE("embedding: gathers rows and scatter-adds cotangents") {
  const std::vector<int64_t> indices = math_golden_indices("embedding.indices");
  check_math_case("embedding", {"weight"}, [&](const Args& v) { return embedding(v[0], indices, {2, 3}); });
  check_gradients(
      [&](const Args& v) {
        return embedding(v[0], indices, {2, 3}) * random_tensor({2, 3, 4}, 41);
      },
      {random_tensor({6, 4}, 42)});

  const Tensor w = Tensor::from_vector({3, 2}, {0, 1, 10, 11, 20, 21});
  const Tensor e = embedding(w, {2, 2, 0}, {3});
  CHECK(e.shape() == Shape{3, 2});
  CHECK(e.to_vector() == std::vector<float>{20, 21, 20, 21, 0, 1});
  // Repeated rows add up; untouched rows get zeros.
  const Tensor u = Tensor::from_vector({3, 2}, {1, 2, 3, 4, 5, 6});
  CHECK(vjp(
            [](const Args& v) {
              return embedding(v[0], {2, 2, 0}, {3});
            },
            {w}, u)[0]
            .to_vector() == std::vector<float>{5, 6, 0, 0, 4, 6});
  // A scalar index shape gives one row.
  CHECK(embedding(w, {1}, {}).to_vector() == std::vector<float>{10, 11});
}

TEST_CASE("embedding: bad input") {
  const Tensor w = Tensor::zeros({5, 3});
  CHECK_THROWS_WITH_AS(embedding(w, {1, 5}, {2}),
                       doctest::Contains("embedding: index 5 at position 1 is out of range for weight [5, 3]"), Error);
  CHECK_THROWS_WITH_AS(embedding(w, {-1}, {1}), doctest::Contains("index -1"), Error);
  CHECK_THROWS_WITH_AS(embedding(w, {1, 2, 3}, {2, 2}),
                       doctest::Contains("embedding: 3 indices for index shape [2, 2]"), Error);
  CHECK_THROWS_WITH_AS(embedding(Tensor::zeros({5}), {1}, {1}), doctest::Contains("weight must be (V, D), got [5]"),
                       Error);
}
