#include "backend/stage.h"

#include <string>

#include "common/error.h"

namespace ppb {

void check_stage_layer(const model::LayerShape& s, int hidden, int layer) {
  const bool attn_ok = s.is_mla() ? s.mla.qk_nope >= 1 && s.mla.qk_rope >= 2 && s.mla.qk_rope % 2 == 0 &&
                                        s.mla.v_head_dim >= 1 && s.mla.q_lora_rank >= 0
                                  : s.n_kv_heads >= 1 && s.n_heads % s.n_kv_heads == 0 && s.head_dim >= 2 &&
                                        s.head_dim % 2 == 0;
  const bool mlp_ok = s.is_moe() ? s.moe.top_k >= 1 && s.moe.top_k <= s.moe.n_experts &&
                                       s.moe.expert_intermediate >= 1 && s.intermediate >= 0
                                 : s.intermediate >= 1;
  if (s.hidden != hidden || s.n_heads < 1 || !attn_ok || !mlp_ok) {
    throw UserError("layer " + std::to_string(layer) + " has an inconsistent shape: hidden=" + std::to_string(s.hidden) +
                    " n_heads=" + std::to_string(s.n_heads) + " n_kv_heads=" + std::to_string(s.n_kv_heads) +
                    " head_dim=" + std::to_string(s.head_dim) + " intermediate=" + std::to_string(s.intermediate) +
                    " experts=" + std::to_string(s.moe.n_experts) + " top_k=" + std::to_string(s.moe.top_k) +
                    " (need n_kv_heads | n_heads, an even head_dim or MLA rope dim, hidden = model hidden, "
                    "1 <= top_k <= experts)");
  }
}

}  // namespace ppb
