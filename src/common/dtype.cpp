#include "common/dtype.h"

#include <algorithm>
#include <cctype>

#include "common/error.h"

namespace ppb {

int dtype_bytes(DType t) {
  switch (t) {
    case DType::f32: return 4;
    case DType::f16: return 2;
    case DType::bf16: return 2;
  }
  return 4;
}

std::string dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "f32";
    case DType::f16: return "f16";
    case DType::bf16: return "bf16";
  }
  return "?";
}

DType parse_dtype(const std::string& s, const std::string& field) {
  std::string v = s;
  std::transform(v.begin(), v.end(), v.begin(), [](unsigned char c) { return std::tolower(c); });
  if (v == "f32" || v == "fp32" || v == "float32") return DType::f32;
  if (v == "f16" || v == "fp16" || v == "float16") return DType::f16;
  if (v == "bf16" || v == "bfloat16") return DType::bf16;
  throw UserError(field + " '" + s + "' is not a data type; valid: f32, f16, bf16");
}

}  // namespace ppb
