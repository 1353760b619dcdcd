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
/// Parses "f32"/"fp32"/"float32", "f16"/"fp16"/"float16", "bf16"/"bfloat16" (any case).
/// `field` names where `s` came from in the error ("--dtype", or a results file's attribute).
/// @throws ppb::UserError "<field> '<s>' is not a data type; valid: f32, f16, bf16".
DType parse_dtype(const std::string& s, const std::string& field = "--dtype");

}  // namespace ppb
