// libFuzzer target of the config.json parser (tests/fuzz/run_fuzz.sh builds and runs it).
//
// Contract checked on every input: parse_model_config either returns a consistent ModelSpec or
// throws ppb::UserError with a message; it never crashes, leaks, hangs or throws anything else
// (ASan + UBSan + libFuzzer's leak and timeout checks). When it parses, every analytic count of
// every unit is evaluated with sane arguments (those of a real run: batch <= 64, context <= 32k
// tokens, 1..4-byte dtypes) and must not throw, overflow (UBSan) or give a negative or
// non-finite value.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>

#include "common/error.h"
#include "common/transfer.h"
#include "model/model_spec.h"

namespace {

using namespace ppb::model;

[[noreturn]] void fail(const char* what, const std::string& detail = "") {
  std::fprintf(stderr, "fuzz_model_config: %s%s%s\n", what, detail.empty() ? "" : ": ", detail.c_str());
  std::abort();
}

void expect(bool ok, const char* what) {
  if (!ok) fail(what);
}

/// Structure of a parsed model: units in pipeline order, signatures in range.
void check_structure(const ModelSpec& m) {
  expect(m.hidden > 0 && m.n_layers > 0 && m.vocab > 0, "non-positive size accepted");
  expect(static_cast<int>(m.layers.size()) == m.n_layers, "layers.size() != n_layers");
  expect(m.num_units() == m.n_layers + 2, "num_units() != n_layers + 2");
  expect(m.units.front().kind == UnitKind::embed && m.units.back().kind == UnitKind::head,
         "embed/head not at the ends");
  expect(m.signature_example.size() == m.signatures.size(), "signature_example size");
  for (int u = 0; u < m.num_units(); ++u) {
    const Unit& unit = m.units[u];
    expect(unit.signature >= 0 && unit.signature < static_cast<int>(m.signatures.size()),
           "signature index out of range");
    if (unit.kind == UnitKind::layer) {
      expect(unit.layer == u - 1, "layer index != unit - 1");
      const LayerShape& s = m.layer_of(u);
      // A MoE layer's intermediate is its shared experts' width (0: none).
      expect(s.n_heads > 0 && s.n_kv_heads > 0 && s.head_dim > 0 && (s.intermediate > 0 || (s.is_moe() && s.intermediate == 0)),
             "non-positive layer size accepted");
      if (s.is_moe())
        expect(s.moe.top_k >= 1 && s.moe.top_k <= s.moe.n_experts && s.moe.expert_intermediate > 0,
               "inconsistent experts accepted");
      if (s.is_mla())
        expect(s.mla.qk_rope > 0 && s.mla.qk_rope % 2 == 0 && s.mla.v_head_dim > 0 && s.mla.q_lora_rank >= 0,
               "inconsistent MLA accepted");
      expect(s.n_heads % s.n_kv_heads == 0, "kv heads do not divide heads");
      expect(s.sliding_window >= 0, "negative sliding window");
      expect(std::isfinite(s.attn_scale) && s.attn_scale > 0.0, "attention scale not positive");
    }
  }
  for (size_t k = 0; k < m.signatures.size(); ++k) {
    int ex = m.signature_example[k];
    expect(ex >= 0 && ex < m.num_units() && m.units[ex].signature == static_cast<int>(k),
           "signature_example wrong");
  }
}

/// Every count of every unit, with the arguments a real run could pass.
void check_counts(const ModelSpec& m) {
  int64_t sum = 0;
  for (int u = 0; u < m.num_units(); ++u) {
    int64_t p = unit_params(m, u);
    expect(p >= 0 && unit_resident_params(m, u) >= p, "unit params");
    sum += p;
    for (int dtype : {1, 2, 4}) {
      expect(kv_bytes_per_token(m, u, dtype) >= 0, "kv_bytes_per_token negative");
      expect(ppb::boundary_message_bytes(u + 1 == m.num_units(), 64, 32768, m.hidden, dtype) >= 0,
             "boundary_message_bytes negative");
    }
    for (int context : {1, 4096, 32768}) {
      expect(kv_cache_bytes(m, u, 64, context, 4) >= 0, "kv_cache_bytes negative");
      for (int batch : {0, 1, 64}) {
        double values[] = {
            unit_flops(m, u, Phase::prefill, batch, context, context),
            unit_flops(m, u, Phase::decode, batch, 1, context),
            unit_bytes_moved(m, u, Phase::prefill, batch, context, context, 4),
            unit_bytes_moved(m, u, Phase::decode, batch, 1, context, 2),
        };
        for (double v : values) expect(std::isfinite(v) && v >= 0.0, "flops/bytes not finite or negative");
      }
    }
  }
  expect(total_params(m) == sum + mtp_params(m), "total_params != sum of unit_params + mtp_params");
  int64_t active = 0;
  for (int u = 0; u < m.num_units(); ++u) active += unit_active_params(m, u);
  expect(active == active_params(m) && active <= sum, "active_params");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  ModelSpec m;
  try {
    m = parse_model_config(text, "fuzz.json");
  } catch (const ppb::UserError& e) {
    expect(e.what()[0] != '\0', "UserError without a message");
    return 0;
  } catch (const std::exception& e) {
    fail("parse_model_config threw a non-UserError", e.what());
  } catch (...) {
    fail("parse_model_config threw a non-exception");
  }
  try {
    check_structure(m);
    check_counts(m);
  } catch (const std::exception& e) {
    fail("a count of a parsed model threw", e.what());
  }
  return 0;
}
