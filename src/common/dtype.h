// Element types of a stage's activations and KV cache (--dtype): sizes, names and parsing.
#pragma once

#include <string>

namespace ppb {

/// The element type of a stage's weights, activations and KV cache (arithmetic and
/// accumulation stay fp32).
enum class DType { f32, f16, bf16 };

/// Bytes of one element of `t`.
int dtype_bytes(DType t);
/// "f32", "f16", "bf16".
std::string dtype_name(DType t);
/// Parses "f32"/"fp32"/"float32", "f16"/"fp16"/"float16", "bf16"/"bfloat16".
/// @throws ppb::UserError naming the valid values.
DType parse_dtype(const std::string& s);

}  // namespace ppb
