// The one place precisions are named: every name parses to the tensor type
// and Hugging Face dtype it stands for and back; anything else is refused
// naming the option and the valid names.
#include "colossus/core/errors.h"
#include "colossus/core/precision.h"

#include <gtest/gtest.h>

#include <string>

namespace colossus {
namespace {

TEST(Precision, NamesTypesAndHuggingFaceDtypesRoundTrip) {
  struct Case {
    const char* name;
    Precision precision;
    c10::ScalarType type;
    const char* hf;
  };
  for (const Case& c : {Case{"fp32", Precision::kFp32, c10::kFloat, "float32"},
                        Case{"bf16", Precision::kBf16, c10::kBFloat16, "bfloat16"},
                        Case{"fp16", Precision::kFp16, c10::kHalf, "float16"}}) {
    ASSERT_EQ(precision_named(c.name), c.precision) << c.name;
    EXPECT_EQ(parse_precision(c.name, "x"), c.precision);
    EXPECT_EQ(std::string(precision_name(c.precision)), c.name);
    EXPECT_EQ(scalar_type_of(c.precision), c.type);
    EXPECT_EQ(precision_of(c.type), c.precision);
    EXPECT_EQ(std::string(hf_dtype_name(c.precision)), c.hf);
    EXPECT_EQ(std::string(*hf_dtype_name(c.type)), c.hf);
  }
  EXPECT_EQ(std::string(*hf_dtype_name(c10::kDouble)), "float64");
  EXPECT_FALSE(hf_dtype_name(c10::kLong).has_value());
  EXPECT_FALSE(precision_of(c10::kDouble).has_value());
}

TEST(Precision, UnknownNamesAreRefusedNamingTheOption) {
  for (const char* bad : {"fp8", "FP32", "bfloat16", ""}) {
    EXPECT_FALSE(precision_named(bad).has_value()) << bad;
    try {
      parse_precision(bad, "gemini: precision");
      FAIL() << bad << " must be refused";
    } catch (const ConfigError& e) {
      EXPECT_EQ(std::string(e.what()), "gemini: precision='" + std::string(bad) + "' is unknown; use fp32, bf16 or fp16");
    }
  }
}

}  // namespace
}  // namespace colossus
