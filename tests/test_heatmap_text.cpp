// Text on pictures: bytes stb_easy_font has no glyph for are drawn as '?', never read from
// outside its glyph table (UTF-8 labels such as "±" reach it from the reports).
#include <doctest/doctest.h>

#include <string>

#include "analysis/common/heatmap.h"

using namespace adjoint;

TEST_CASE("heatmap text: a byte without a glyph is measured and drawn as '?'") {
  CHECK(text_width("a \xc2\xb1 b") == text_width("a ?? b"));
  CHECK(text_width("\x01x") == text_width("?x"));
  CHECK(text_width("ab") > 0);
  CHECK(text_width("\xc3\x97") > text_width("?"));  // one '?' a byte
}
